import { readFileSync } from "node:fs";
import { createClient, type Client as RpcClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";

import { CodeService } from "./gen/sbx/v1/code_pb.js";
import { CodebaseService } from "./gen/sbx/v1/codebase_pb.js";
import { ImageService } from "./gen/sbx/v1/images_pb.js";
import { ObserveService } from "./gen/sbx/v1/observe_pb.js";
import { ProcessService } from "./gen/sbx/v1/processes_pb.js";
import { TenantService } from "./gen/sbx/v1/tenants_pb.js";
import { PortService } from "./gen/sbx/v1/ports_pb.js";
import { SandboxService } from "./gen/sbx/v1/sandbox_pb.js";
import { SessionService } from "./gen/sbx/v1/session_pb.js";
import { VolumeService } from "./gen/sbx/v1/volumes_pb.js";
import { Codebases } from "./codebases.js";
import { call } from "./errors.js";
import { Images } from "./images.js";
import { events, stats, type EventsOptions, type SandboxUsage, type SbxEvent } from "./observe.js";
import { Tenants, type Tenant } from "./tenants.js";
import { Volumes } from "./volumes.js";

/** Where the daemon listens unless told otherwise. */
export const DEFAULT_ADDR = "127.0.0.1:7777";

export interface ClientOptions {
  /** "host:port" or an http(s):// URL (default $SBX_ADDR, else 127.0.0.1:7777). */
  addr?: string;
  /** The API token, sent as Authorization: Bearer (default $SBX_TOKEN). */
  token?: string;
  /** PEM CA certificate(s) to trust for https (default the file $SBX_CACERT names). */
  ca?: string | Buffer;
  /** Default deadline of unary calls, in seconds (default none). */
  timeout?: number;
}

/** Client is a connection to one daemon: the generated Connect clients over
 * HTTP/2 (h2c for http://, TLS for https://), with the token on every call. */
export class Client {
  readonly baseUrl: string;
  /** The generated clients, for what the hand-written surface does not cover. */
  readonly rpc: {
    sandboxes: RpcClient<typeof SandboxService>;
    code: RpcClient<typeof CodeService>;
    sessions: RpcClient<typeof SessionService>;
    ports: RpcClient<typeof PortService>;
    volumes: RpcClient<typeof VolumeService>;
    codebases: RpcClient<typeof CodebaseService>;
    images: RpcClient<typeof ImageService>;
    processes: RpcClient<typeof ProcessService>;
    observe: RpcClient<typeof ObserveService>;
    tenants: RpcClient<typeof TenantService>;
  };
  readonly transport: Transport;
  readonly volumes: Volumes;
  readonly codebases: Codebases;
  readonly images: Images;
  readonly tenants: Tenants;

  constructor(opts: ClientOptions = {}) {
    const addr = opts.addr || process.env.SBX_ADDR || DEFAULT_ADDR;
    this.baseUrl = (addr.includes("://") ? addr : `http://${addr}`).replace(/\/+$/, "");
    const token = opts.token ?? process.env.SBX_TOKEN ?? "";
    let ca = opts.ca;
    if (ca === undefined && process.env.SBX_CACERT) {
      ca = readFileSync(process.env.SBX_CACERT);
    }
    const auth: Interceptor = (next) => (req) => {
      if (token) {
        req.header.set("Authorization", `Bearer ${token}`);
      }
      return next(req);
    };
    this.transport = createConnectTransport({
      baseUrl: this.baseUrl,
      httpVersion: "2",
      useBinaryFormat: true,
      interceptors: [auth],
      defaultTimeoutMs: opts.timeout ? opts.timeout * 1000 : undefined,
      nodeOptions: ca ? { ca } : undefined,
    });
    this.rpc = {
      sandboxes: createClient(SandboxService, this.transport),
      code: createClient(CodeService, this.transport),
      sessions: createClient(SessionService, this.transport),
      ports: createClient(PortService, this.transport),
      volumes: createClient(VolumeService, this.transport),
      codebases: createClient(CodebaseService, this.transport),
      images: createClient(ImageService, this.transport),
      processes: createClient(ProcessService, this.transport),
      observe: createClient(ObserveService, this.transport),
      tenants: createClient(TenantService, this.transport),
    };
    this.volumes = new Volumes(this);
    this.codebases = new Codebases(this);
    this.images = new Images(this);
    this.tenants = new Tenants(this);
  }

  /** The token's tenant: its quotas and what it uses against them. */
  tenant(): Promise<Tenant> {
    return this.tenants.current();
  }

  /**
   * The daemon's events the token may see, in order:
   *
   *     for await (const ev of client.events({ types: ["oom", "destroyed"] })) { ... }
   *
   * `since` or `afterSeq` first replays the held events; follow: false
   * stops after that replay; abort `signal` to stop following.
   */
  events(opts: EventsOptions = {}): AsyncGenerator<SbxEvent> {
    return events(this, opts);
  }

  /** Current usage of the sandboxes named (ids or names; every one the
   * token may see when none); history adds the last 15 minutes of samples. */
  stats(sandboxes: string[] = [], opts: { history?: boolean } = {}): Promise<SandboxUsage[]> {
    return stats(this, sandboxes, opts.history ?? false);
  }

  /** The daemon's version and runtimes. */
  async version(): Promise<{ version: string; commit: string; runtimes: string[] }> {
    const r = await call("version", () => this.rpc.sandboxes.version({}));
    return { version: r.version, commit: r.commit, runtimes: r.runtimes.map((rt) => rt.name) };
  }
}

let defaultClient: Client | undefined;

/** The client of $SBX_ADDR / $SBX_TOKEN, made on first use. */
export function getDefaultClient(): Client {
  defaultClient ??= new Client();
  return defaultClient;
}
