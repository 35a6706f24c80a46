import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

import { create } from "@bufbuild/protobuf";

import { ExecRequestSchema, type ExecRequest } from "./gen/sbx/v1/process_pb.js";
import { PatternType, Permission, type PathPolicy as PbPathPolicy } from "./gen/sbx/v1/permissions_pb.js";
import { IdleAction, NetworkMode, SandboxState, type Sandbox as PbSandbox } from "./gen/sbx/v1/sandbox_pb.js";
import { Client, getDefaultClient } from "./client.js";
import { CodeContext, runCode, type CodeResult, type RunCodeOptions } from "./code.js";
import { call, NotFoundError, toSbxError } from "./errors.js";
import { Files } from "./files.js";
import { SandboxFile } from "./fileobj.js";
import type { WalkOptions } from "./localtree.js";
import { imageOf, type ImageInfo } from "./images.js";
import { collect, exitStatusOf, Process, type CommandResult, type ExitStatus, type OutputHandlers } from "./process.js";
import { Processes } from "./processes.js";
import { Session } from "./session.js";
import { parseSize } from "./size.js";

/** What a permission rule lets the sandbox do with the paths it matches:
 * none (hidden), view (listed, not read), read, write. */
export type PermissionName = "none" | "view" | "read" | "write";

/** A rule of a guarded directory: a glob ("*.pem"), or a directory or file
 * path relative to the guarded directory ("/docs"). */
export interface PermissionRule {
  pattern: string;
  permission: PermissionName;
  type?: "glob" | "directory" | "file";
  priority?: number;
  caseInsensitive?: boolean;
}

/** A directory of the sandbox seen through permission rules (a preset
 * such as "development" or "agent-safe", rules, and a default). */
export interface PathPolicy {
  path: string;
  preset?: string;
  rules?: PermissionRule[];
  default?: PermissionName;
}

const PERMISSIONS: Record<PermissionName, Permission> = {
  none: Permission.NONE, view: Permission.VIEW, read: Permission.READ, write: Permission.WRITE,
};
const PATTERN_TYPES = { glob: PatternType.GLOB, directory: PatternType.DIRECTORY, file: PatternType.FILE };

function permissionOf(p: string | undefined, what: string): Permission {
  if (p === undefined) {
    return Permission.UNSPECIFIED;
  }
  const v = PERMISSIONS[p as PermissionName];
  if (v === undefined) {
    throw new RangeError(`${what}: permission ${JSON.stringify(p)}: want one of ${Object.keys(PERMISSIONS).join(", ")}`);
  }
  return v;
}

function rulesOf(rules: PermissionRule[] | undefined) {
  return (rules ?? []).map((r) => {
    const type = r.type === undefined ? PatternType.UNSPECIFIED : PATTERN_TYPES[r.type];
    if (type === undefined) {
      throw new RangeError(`rule ${r.pattern}: type ${JSON.stringify(r.type)}: want glob, directory or file`);
    }
    return {
      pattern: r.pattern, type, permission: permissionOf(r.permission, `rule ${r.pattern}`),
      priority: r.priority ?? 0, caseInsensitive: r.caseInsensitive ?? false,
    };
  });
}

function permissionName(p: Permission): PermissionName | undefined {
  return (Object.entries(PERMISSIONS) as [PermissionName, Permission][]).find(([, v]) => v === p)?.[0];
}

function pathPolicyOf(p: PbPathPolicy): PathPolicy {
  return {
    path: p.path, preset: p.preset || undefined, default: permissionName(p.defaultPermission),
    rules: p.rules.map((r) => ({
      pattern: r.pattern, permission: permissionName(r.permission) ?? "none",
      type: r.type === PatternType.UNSPECIFIED ? undefined : (Object.entries(PATTERN_TYPES).find(([, v]) => v === r.type)?.[0] as PermissionRule["type"]),
      priority: r.priority || undefined, caseInsensitive: r.caseInsensitive || undefined,
    })),
  };
}

/** Options of Sandbox.create. Unset ones take the daemon's defaults. */
export interface CreateOptions {
  /** Image reference (default "host": the host's /usr, read-only). */
  image?: string;
  /** Unique name among live sandboxes: [a-z0-9][a-z0-9_.-]{0,62}. */
  name?: string;
  labels?: Record<string, string>;
  /** Environment of every command. */
  env?: Record<string, string>;
  /** Environment variables whose values the API never returns. */
  secrets?: Record<string, string>;
  /** CPU limit in CPUs (0.5 is half a CPU). */
  cpu?: number;
  /** Memory limit: bytes or a size like "512M". */
  memory?: number | string;
  pids?: number;
  /** Bound of the writable layer: bytes or a size like "1G". */
  disk?: number | string;
  /** Lifetime in seconds, after which the sandbox is destroyed. */
  timeout?: number;
  /** Seconds without exec or file activity before the sandbox is destroyed. */
  idleTimeout?: number;
  workdir?: string;
  user?: string;
  /** A long-running command started with the sandbox. */
  command?: string[];
  runtime?: string;
  /** "public" (default), "none", or an allowlist. */
  network?: "public" | "none" | { allowCidrs?: string[]; allowDomains?: string[] };
  volumes?: { volume: string; path: string; readOnly?: boolean }[];
  /** Directories guarded by permission rules (files there are seen through them). */
  pathPolicies?: PathPolicy[];
  codebases?: { codebase: string; path: string; preset?: string; rules?: PermissionRule[]; default?: PermissionName }[];
  /** Secrets kept out of the sandbox: it sees a placeholder in env `name`;
   * the egress proxy sends the value to the listed domains only (over
   * HTTPS, in the headers named; Authorization by default). */
  domainSecrets?: { name: string; value: string; domains: string[]; headers?: string[]; allowQuery?: boolean }[];
  /** Stop (freeze) instead of destroying the sandbox at its idle timeout. */
  stopWhenIdle?: boolean;
  /** Give the sandbox a scoped API token (SBX_TOKEN) to manage child sandboxes. */
  scopedToken?: boolean;
  /** Start the image's ENTRYPOINT/CMD (default true). */
  entrypoint?: boolean;
  /** Start the stopped sandbox when it is used (exec, files, ports). */
  autoResume?: boolean;
  /** Instead of image: the path of a Dockerfile to build first (its
   * directory is the context; see images.build), tagged
   * localhost/sbx-dockerfile/<hash of it and its args>. */
  dockerfile?: string;
  /** The Dockerfile's ARGs. */
  buildArgs?: Record<string, string>;
  client?: Client;
}

/** A piece of the sandbox's own command's output. */
export interface LogChunk {
  stream: "stdout" | "stderr";
  data: Uint8Array;
  text: string;
  time: Date;
}

/** Options of exec and run. */
export interface ExecOptions extends OutputHandlers {
  env?: Record<string, string>;
  /** Working directory. */
  cwd?: string;
  /** Seconds before the command is killed. */
  timeout?: number;
  user?: string;
  /** Bytes given on stdin before it is closed (run, and exec without openStdin). */
  stdin?: string | Uint8Array;
}

/** The state of a sandbox as the daemon last reported it. */
export interface SandboxInfo {
  id: string;
  name: string;
  image: string;
  state: "creating" | "running" | "stopped" | "destroying" | "destroyed" | "failed" | "unknown";
  labels: Record<string, string>;
  createdAt: Date;
  expiresAt?: Date;
  stateDetail: string;
  ipAddress: string;
  /** Its limits (0: the daemon's default or none); cpu in CPUs. */
  resources: { memoryBytes: number; cpu: number; pids: number; diskBytes: number };
  autoResume: boolean;
  pathPolicies: PathPolicy[];
  /** Live usage when the daemon was last asked (fromId, refresh, stats). */
  stats?: SandboxStats;
}

/** A sandbox's live usage. */
export interface SandboxStats {
  memoryBytes: number;
  memoryPeakBytes: number;
  cpuUsageNs: number;
  pids: number;
  diskUsedBytes: number;
  netRxBytes: number;
  netTxBytes: number;
  netConnections: number;
}

function statsOf(st: PbSandbox["stats"]): SandboxStats {
  return {
    memoryBytes: Number(st?.memoryBytes ?? 0), memoryPeakBytes: Number(st?.memoryPeakBytes ?? 0), cpuUsageNs: Number(st?.cpuUsageNs ?? 0),
    pids: Number(st?.pids ?? 0), diskUsedBytes: Number(st?.diskUsedBytes ?? 0), netRxBytes: Number(st?.netRxBytes ?? 0),
    netTxBytes: Number(st?.netTxBytes ?? 0), netConnections: Number(st?.netConnections ?? 0),
  };
}

function stateName(s: SandboxState): SandboxInfo["state"] {
  switch (s) {
    case SandboxState.CREATING:
      return "creating";
    case SandboxState.RUNNING:
      return "running";
    case SandboxState.STOPPED:
      return "stopped";
    case SandboxState.DESTROYING:
      return "destroying";
    case SandboxState.DESTROYED:
      return "destroyed";
    case SandboxState.FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

function infoOf(s: PbSandbox): SandboxInfo {
  return {
    id: s.id, name: s.name, image: s.image, state: stateName(s.state), labels: s.labels,
    createdAt: new Date(Number(s.createdAtMs)), expiresAt: s.expiresAtMs > 0n ? new Date(Number(s.expiresAtMs)) : undefined,
    stateDetail: s.stateDetail, ipAddress: s.ipAddress, stats: s.stats ? statsOf(s.stats) : undefined,
    resources: {
      memoryBytes: Number(s.resources?.memoryBytes ?? 0), cpu: Number(s.resources?.cpuMillis ?? 0) / 1000,
      pids: Number(s.resources?.pids ?? 0), diskBytes: Number(s.resources?.diskBytes ?? 0),
    },
    autoResume: s.autoResume,
    pathPolicies: s.pathPolicies.map(pathPolicyOf),
  };
}

/** How a server in the sandbox is reached through the daemon. */
export interface Port {
  port: number;
  url: string;
  hostUrl: string;
  websocketUrl: string;
  tcpUrl: string;
  /** Routing headers: requests to the daemon's own address that carry
   * them reach the port too (instead of using url). */
  headers: Record<string, string>;
}

function networkOf(n: CreateOptions["network"]): { mode: NetworkMode; allowCidrs?: string[]; allowDomains?: string[] } | undefined {
  if (n === "none") {
    return { mode: NetworkMode.NONE };
  }
  if (n === "public") {
    return { mode: NetworkMode.PUBLIC };
  }
  if (n) {
    return { mode: NetworkMode.ALLOW, allowCidrs: n.allowCidrs ?? [], allowDomains: n.allowDomains ?? [] };
  }
  return undefined;
}

function ms(seconds: number | undefined): bigint {
  return BigInt(Math.round((seconds ?? 0) * 1000));
}

function bytesOf(data: string | Uint8Array | undefined): Uint8Array {
  if (data === undefined) {
    return new Uint8Array();
  }
  return typeof data === "string" ? new TextEncoder().encode(data) : data;
}

/**
 * A sandbox: an isolated Linux environment on the daemon.
 *
 *     const sb = await Sandbox.create({ memory: "256M", timeout: 600 });
 *     const r = await sb.run("python3 -c 'print(6*7)'");
 *     console.log(r.stdout, r.exitCode);
 *     await sb.terminate();
 */
export class Sandbox {
  readonly files: Files;
  /** Background processes: commands that outlive their client. */
  readonly processes: Processes;
  private _info: SandboxInfo;
  /** Codebases fromLocal made for this sandbox, deleted after it by terminate. */
  private ownCodebases: string[] = [];

  /** @internal */
  constructor(readonly client: Client, info: SandboxInfo) {
    this._info = info;
    this.files = new Files(client, info.id);
    this.processes = new Processes(client, info.id);
  }

  /** Create a sandbox and return once it is ready for commands. */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const c = opts.client ?? getDefaultClient();
    const network = networkOf(opts.network);
    let image = opts.image ?? "";
    if (opts.dockerfile !== undefined) {
      if (image) {
        throw new RangeError("create: give an image or a dockerfile, not both");
      }
      // Named by the Dockerfile and its args: an unchanged one runs no step.
      const h = createHash("sha256").update(readFileSync(opts.dockerfile));
      for (const k of Object.keys(opts.buildArgs ?? {}).sort()) {
        h.update(`\0${k}=${opts.buildArgs?.[k]}`);
      }
      image = `localhost/sbx-dockerfile/${h.digest("hex").slice(0, 16)}:latest`;
      await c.images.build({ dockerfile: opts.dockerfile, buildArgs: opts.buildArgs }, { tag: image });
    } else if (opts.buildArgs) {
      throw new RangeError("create: buildArgs go with a dockerfile");
    }
    const r = await call("create sandbox", () => c.rpc.sandboxes.createSandbox({
      image, name: opts.name ?? "", labels: opts.labels ?? {}, env: opts.env ?? {}, secrets: opts.secrets ?? {},
      command: opts.command ?? [], workdir: opts.workdir ?? "", user: opts.user ?? "", runtime: opts.runtime ?? "",
      resources: {
        memoryBytes: BigInt(parseSize(opts.memory)), cpuMillis: BigInt(Math.round((opts.cpu ?? 0) * 1000)),
        pids: BigInt(opts.pids ?? 0), diskBytes: BigInt(parseSize(opts.disk)),
      },
      timeoutMs: ms(opts.timeout), idleTimeoutMs: ms(opts.idleTimeout), network,
      volumes: (opts.volumes ?? []).map((v) => ({ volume: v.volume, path: v.path, readOnly: v.readOnly ?? false })),
      codebases: (opts.codebases ?? []).map((cb) => ({
        codebase: cb.codebase, path: cb.path, preset: cb.preset ?? "", rules: rulesOf(cb.rules),
        defaultPermission: permissionOf(cb.default, `codebase ${cb.codebase}`),
      })),
      pathPolicies: (opts.pathPolicies ?? []).map((p) => ({
        path: p.path, preset: p.preset ?? "", rules: rulesOf(p.rules), defaultPermission: permissionOf(p.default, `path policy ${p.path}`),
      })),
      domainSecrets: (opts.domainSecrets ?? []).map((ds) => ({
        name: ds.name, value: ds.value, domains: ds.domains, headers: ds.headers ?? [], allowQuery: ds.allowQuery ?? false,
      })),
      idleAction: opts.stopWhenIdle ? IdleAction.STOP : IdleAction.UNSPECIFIED,
      scopedToken: opts.scopedToken ?? false, noEntrypoint: opts.entrypoint === false, autoResume: opts.autoResume ?? false,
    }));
    if (!r.sandbox) {
      throw new NotFoundError("not_found", "create sandbox: the daemon returned no sandbox");
    }
    return new Sandbox(c, infoOf(r.sandbox));
  }

  /**
   * Upload the local directory `dir` as a codebase (codebases.fromLocal:
   * its .gitignore and .sandboxignore rules and `ignore` apply) and create
   * a sandbox with it mounted at `mount` (default /workspace), guarded by
   * `preset` (default "view-only": the sandbox sees names and metadata and
   * reads nothing; "read-only", "agent-safe"... open more, `rules` refine
   * it), in one call, like the Python SDK's Sandbox.from_local. `preset: ""`
   * mounts it unguarded: writable in the sandbox's own copy-on-write layer
   * (syncCodebase writes changes back). terminate() destroys the sandbox,
   * then deletes the codebase (unless keepCodebases); if the create fails,
   * the codebase is deleted at once. Other options are create's.
   */
  static async fromLocal(dir: string, opts: CreateOptions & WalkOptions & {
    preset?: string; mount?: string; rules?: PermissionRule[];
  } = {}): Promise<Sandbox> {
    const c = opts.client ?? getDefaultClient();
    const { preset, mount, rules, ignore, maxFileBytes, includeGit, useIgnoreFiles, ...createOpts } = opts;
    const cb = await c.codebases.fromLocal(dir, { ignore, maxFileBytes, includeGit, useIgnoreFiles });
    let sb: Sandbox;
    try {
      sb = await Sandbox.create({
        ...createOpts, client: c,
        codebases: [{ codebase: cb.id, path: mount ?? "/workspace", preset: preset ?? "view-only", rules }, ...(createOpts.codebases ?? [])],
      });
    } catch (e) {
      await c.codebases.delete(cb.id).catch(() => undefined);
      throw e;
    }
    sb.ownCodebases.push(cb.id);
    return sb;
  }

  /** The sandbox with this id (it must exist). */
  static async fromId(id: string, opts: { client?: Client } = {}): Promise<Sandbox> {
    const c = opts.client ?? getDefaultClient();
    const r = await call(`get sandbox ${id}`, () => c.rpc.sandboxes.getSandbox({ sandbox: id }));
    if (!r.sandbox) {
      throw new NotFoundError("not_found", `get sandbox ${id}: no such sandbox`);
    }
    return new Sandbox(c, infoOf(r.sandbox));
  }

  /** The live sandbox with this name. */
  static fromName(name: string, opts: { client?: Client } = {}): Promise<Sandbox> {
    return Sandbox.fromId(name, opts);
  }

  /** The sandboxes whose labels match every selector ("k=v", "k!=v", "k", "!k"). */
  static async list(opts: { selectors?: string[]; labels?: Record<string, string>; client?: Client } = {}): Promise<Sandbox[]> {
    const c = opts.client ?? getDefaultClient();
    const selectors = [...(opts.selectors ?? []), ...Object.entries(opts.labels ?? {}).map(([k, v]) => `${k}=${v}`)];
    const r = await call("list sandboxes", () => c.rpc.sandboxes.listSandboxes({ selectors }));
    return r.sandboxes.map((s) => new Sandbox(c, infoOf(s)));
  }

  get id(): string {
    return this._info.id;
  }
  get name(): string {
    return this._info.name;
  }
  get state(): SandboxInfo["state"] {
    return this._info.state;
  }
  get info(): SandboxInfo {
    return this._info;
  }

  /** Fetch the sandbox's state again. */
  async refresh(): Promise<this> {
    const r = await call(`get sandbox ${this.id}`, () => this.client.rpc.sandboxes.getSandbox({ sandbox: this.id }));
    if (r.sandbox) {
      this._info = infoOf(r.sandbox);
    }
    return this;
  }

  /** Live usage (memory, CPU, PIDs, disk, network), fetched from the
   * daemon on each call (this also refreshes info). */
  async stats(): Promise<SandboxStats> {
    await this.refresh();
    return this._info.stats ?? statsOf(undefined);
  }

  /** Freeze every process (memory and files are kept). */
  async stop(): Promise<void> {
    await call(`stop ${this.id}`, () => this.client.rpc.sandboxes.stopSandbox({ sandbox: this.id }));
  }

  /** Thaw a stopped sandbox. */
  async start(): Promise<void> {
    await call(`start ${this.id}`, () => this.client.rpc.sandboxes.startSandbox({ sandbox: this.id }));
  }

  /** Destroy the sandbox and everything in it; then the codebase
   * fromLocal made for it, unless keepCodebases. */
  async terminate(opts: { syncCodebases?: boolean; keepCodebases?: boolean } = {}): Promise<void> {
    await call(`destroy ${this.id}`, () => this.client.rpc.sandboxes.destroySandbox({ sandbox: this.id, syncCodebases: opts.syncCodebases ?? false }));
    if (opts.keepCodebases) {
      return;
    }
    for (const id of this.ownCodebases.splice(0)) {
      try {
        await this.client.codebases.delete(id);
      } catch (e) {
        if (!(e instanceof NotFoundError)) {
          throw e;
        }
      }
    }
  }

  /** Write this sandbox's changes under its codebase mount at `path`
   * (default: its only one) back into the codebase. */
  syncCodebase(opts: { path?: string; dryRun?: boolean; force?: boolean } = {}) {
    return this.client.codebases.sync(this.id, opts);
  }

  /**
   * Open a file of the sandbox as a stream (like Python's sandbox.open,
   * but streaming): mode "r" reads it as you consume it (for await, .readable,
   * .nodeStream(), read(), text()); "w" (truncate), "a" (append) and "x"
   * (create, AlreadyExistsError if it exists) send what you write() as you
   * write it; close() finishes. `perm` is a created file's mode (0o644).
   *
   *     const f = await sb.open("/tmp/out.txt", "w");
   *     await f.write("hello\n");
   *     await f.close();
   *     await pipeline((await sb.open("/tmp/big.bin")).nodeStream(), createWriteStream("big.bin"));
   *
   * Throws NotFoundError (mode r and no such file), AlreadyExistsError
   * (mode x and the file exists), RangeError (a bad mode; "+" modes are
   * refused: a stream has no random access).
   */
  open(path: string, mode: string = "r", opts: { perm?: number } = {}): Promise<SandboxFile> {
    return SandboxFile.open(this.client, this.files, this.id, path, mode, opts.perm ?? 0o644);
  }

  /**
   * Change a live sandbox: its lifetime and idle timeout (seconds from now),
   * labels, and resource limits (memory may not drop below what it uses).
   */
  async update(opts: {
    timeout?: number; idleTimeout?: number; stopWhenIdle?: boolean;
    setLabels?: Record<string, string>; removeLabels?: string[]; replaceLabels?: boolean;
    memory?: number | string; cpu?: number; pids?: number; autoResume?: boolean;
  }): Promise<void> {
    for (const [k, v] of [["timeout", opts.timeout], ["idleTimeout", opts.idleTimeout]] as const) {
      if (v !== undefined && !(v >= 0)) {
        throw new RangeError(`update: ${k} ${v}: want seconds, 0 or more`);
      }
    }
    for (const [k, v] of [["cpu", opts.cpu], ["pids", opts.pids]] as const) {
      if (v !== undefined && !(v > 0)) {
        throw new RangeError(`update: ${k} ${v}: want a positive number`);
      }
    }
    const r = await call(`update ${this.id}`, () => this.client.rpc.sandboxes.updateSandbox({
      sandbox: this.id,
      timeoutMs: opts.timeout === undefined ? undefined : ms(opts.timeout),
      idleTimeoutMs: opts.idleTimeout === undefined ? undefined : ms(opts.idleTimeout),
      idleAction: opts.stopWhenIdle === undefined ? IdleAction.UNSPECIFIED : opts.stopWhenIdle ? IdleAction.STOP : IdleAction.DESTROY,
      setLabels: opts.setLabels ?? {}, removeLabels: opts.removeLabels ?? [], replaceLabels: opts.replaceLabels ?? false,
      resources: {
        memoryBytes: BigInt(parseSize(opts.memory)), cpuMillis: BigInt(Math.round((opts.cpu ?? 0) * 1000)), pids: BigInt(opts.pids ?? 0),
      },
      autoResume: opts.autoResume,
    }));
    if (r.sandbox) {
      this._info = infoOf(r.sandbox);
    }
  }

  /** A new lifetime in seconds counted from now (E2B's setTimeout). */
  setTimeout(seconds: number): Promise<void> {
    return this.update({ timeout: seconds });
  }

  /** Add or replace labels. */
  setLabels(labels: Record<string, string>): Promise<void> {
    return this.update({ setLabels: labels });
  }

  /** Change the network policy of the running sandbox (open connections included). */
  async updateNetwork(network: NonNullable<CreateOptions["network"]>): Promise<void> {
    await call(`update network of ${this.id}`, () => this.client.rpc.sandboxes.updateNetwork({ sandbox: this.id, network: networkOf(network) }));
  }

  /**
   * The output of the sandbox's own command (`command`, else the image's
   * ENTRYPOINT/CMD): what is kept, then (with follow) what comes until it
   * exits. `tail` keeps only the last lines kept; `since` starts later.
   */
  async *logs(opts: { follow?: boolean; tail?: number; since?: Date } = {}): AsyncGenerator<LogChunk> {
    const dec = new TextDecoder();
    try {
      for await (const m of this.client.rpc.sandboxes.logs({
        sandbox: this.id, follow: opts.follow ?? false, tail: opts.tail, sinceUnixMs: BigInt(opts.since?.getTime() ?? 0),
      })) {
        if (m.event.case === "data") {
          const d = m.event.value;
          yield { stream: d.stderr ? "stderr" : "stdout", data: d.data, text: dec.decode(d.data), time: new Date(Number(d.timeUnixMs)) };
        }
      }
    } catch (e) {
      throw toSbxError(`logs of ${this.id}`, e);
    }
  }

  /** Wait for the sandbox's own command to exit and return how it ended. */
  async wait(): Promise<ExitStatus> {
    const r = await call(`wait for ${this.id}`, () => this.client.rpc.sandboxes.wait({ sandbox: this.id }, { timeoutMs: 0 }));
    if (!r.exited) {
      throw toSbxError(`wait for ${this.id}`, new Error("the daemon returned no exit status"));
    }
    return exitStatusOf(r.exited);
  }

  /** Save the sandbox's filesystem as an image (tagged tag, if given). */
  async snapshot(tag = ""): Promise<ImageInfo> {
    const r = await call(`snapshot ${this.id}`, () => this.client.rpc.sandboxes.snapshotSandbox({ sandbox: this.id, tag }));
    return imageOf(r.image);
  }

  private execRequest(argv: string[] | undefined, shell: string | undefined, opts: ExecOptions, stdinOpen: boolean): ExecRequest {
    return create(ExecRequestSchema, {
      sandbox: this.id, argv: argv ?? [], shell: shell ?? "", env: opts.env ?? {}, workdir: opts.cwd ?? "",
      timeoutMs: ms(opts.timeout), user: opts.user ?? "", stdin: bytesOf(opts.stdin), stdinOpen,
    });
  }

  /**
   * Run a command to its end and return its exit status and output.
   * A string is a shell command line (/bin/sh -c); an array is argv.
   * A failing command is not an error: look at exitCode.
   */
  async run(cmd: string | string[], opts: ExecOptions = {}): Promise<CommandResult> {
    const req = typeof cmd === "string" ? this.execRequest(undefined, cmd, opts, false) : this.execRequest(cmd, undefined, opts, false);
    return collect("exec", this.client.rpc.sandboxes.exec(req), opts);
  }

  /**
   * Start a command with its stdin open: write to it, close it, signal the
   * command, and wait() for its end. Output streams to onStdout/onStderr.
   */
  exec(argv: string[], opts: ExecOptions = {}): Process {
    const req = this.execRequest(argv, undefined, opts, true);
    return new Process(req, (input, signal) => this.client.rpc.sandboxes.execInteractive(input, { signal }), opts);
  }

  /** Run code ("python" by default) and return its output and artifacts (figures). */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<CodeResult> {
    return runCode(this.client, { sandbox: this.id, language: opts.language ?? "python" }, code, opts);
  }

  /** Start a stateful interpreter ("python" or "javascript"). */
  async createContext(language = "python", opts: { cwd?: string; env?: Record<string, string> } = {}): Promise<CodeContext> {
    const r = await call("create context", () => this.client.rpc.code.createContext({ sandbox: this.id, language, cwd: opts.cwd ?? "", env: opts.env ?? {} }));
    return new CodeContext(this.client, r.context?.id ?? "", this.id, r.context?.language ?? language);
  }

  async listContexts(): Promise<CodeContext[]> {
    const r = await call("list contexts", () => this.client.rpc.code.listContexts({ sandbox: this.id }));
    return r.contexts.map((cc) => new CodeContext(this.client, cc.id, cc.sandbox, cc.language));
  }

  /** Start a long-lived shell whose state persists between commands. */
  async session(opts: { shell?: string; env?: Record<string, string>; cwd?: string } = {}): Promise<Session> {
    const r = await call("create session", () => this.client.rpc.sessions.createSession({
      sandbox: this.id, shell: opts.shell ?? "", env: opts.env ?? {}, workdir: opts.cwd ?? "",
    }));
    return new Session(this.client, r.session?.id ?? "", this.id, r.session?.shell ?? "");
  }

  async listSessions(): Promise<Session[]> {
    const r = await call("list sessions", () => this.client.rpc.sessions.listSessions({ sandbox: this.id }));
    return r.sessions.map((s) => new Session(this.client, s.id, s.sandbox, s.shell));
  }

  /** How a server listening on port in the sandbox is reached. */
  async getPort(port: number): Promise<Port> {
    const r = await call(`get port ${port}`, () => this.client.rpc.ports.getPort({ sandbox: this.id, port }));
    const p = r.port;
    return {
      port: p?.port ?? port, url: p?.url ?? "", hostUrl: p?.hostUrl ?? "", websocketUrl: p?.websocketUrl ?? "",
      tcpUrl: p?.tcpUrl ?? "", headers: p?.headers ?? {},
    };
  }

  /** The URL at which the daemon proxies `port` (HTTP and WebSocket), like
   * E2B's getHost: the host-name URL when the daemon has a proxy domain,
   * else the path-routed one. */
  async getHost(port: number): Promise<string> {
    const p = await this.getPort(port);
    return p.hostUrl || p.url;
  }

  /** The ports servers in the sandbox listen on. */
  async ports(): Promise<Port[]> {
    const r = await call("list ports", () => this.client.rpc.ports.listPorts({ sandbox: this.id }));
    return r.ports.map((p) => ({ port: p.port, url: p.url, hostUrl: p.hostUrl, websocketUrl: p.websocketUrl, tcpUrl: p.tcpUrl, headers: p.headers }));
  }
}
