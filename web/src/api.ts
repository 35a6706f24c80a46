// The daemon's Connect API, as the dashboard calls it: the token from the
// login page in this tab's sessionStorage, sent as Authorization: Bearer on
// every call (no cookie: nothing another page can make the browser send).
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { toBinary, fromBinary, create } from "@bufbuild/protobuf";
import { SandboxService } from "@gen/sandbox_pb.js";
import { ObserveService } from "@gen/observe_pb.js";
import { ImageService } from "@gen/images_pb.js";
import { VolumeService } from "@gen/volumes_pb.js";
import { CodebaseService } from "@gen/codebase_pb.js";
import { WriteFileRequestSchema, WriteFileResponseSchema } from "@gen/files_pb.js";

const tokenKey = "sbx.token";

export function token(): string {
  return sessionStorage.getItem(tokenKey) ?? "";
}

export function setToken(t: string): void {
  if (t) sessionStorage.setItem(tokenKey, t);
  else sessionStorage.removeItem(tokenKey);
}

// onUnauthenticated is called when the daemon refuses the token.
export let onUnauthenticated: () => void = () => {};
export function setOnUnauthenticated(f: () => void): void {
  onUnauthenticated = f;
}

function authHeader(): Record<string, string> {
  const t = token();
  return t ? { Authorization: "Bearer " + t } : {};
}

const auth: Interceptor = (next) => async (req) => {
  const t = token();
  if (t) req.header.set("Authorization", "Bearer " + t);
  try {
    return await next(req);
  } catch (e) {
    if (e instanceof ConnectError && e.code === Code.Unauthenticated) onUnauthenticated();
    throw e;
  }
};

const transport = createConnectTransport({
  baseUrl: location.origin,
  useBinaryFormat: true,
  interceptors: [auth],
});

export const sandboxes = createClient(SandboxService, transport);
export const observe = createClient(ObserveService, transport);
export const images = createClient(ImageService, transport);
export const volumes = createClient(VolumeService, transport);
export const codebases = createClient(CodebaseService, transport);

export function errText(e: unknown): string {
  if (e instanceof ConnectError) return e.rawMessage || e.message;
  return e instanceof Error ? e.message : String(e);
}

// writeFile uploads data with the WriteFile RPC, a client stream, which
// connect-web does not send: the Connect protocol's client streams work over
// HTTP/1.1 with the whole body at once, so this sends the enveloped
// messages (header, then 1 MiB data pieces) as one request.
export async function writeFile(sandbox: string, path: string, data: Uint8Array, mode = 0o644): Promise<bigint> {
  const msgs: Uint8Array[] = [
    toBinary(WriteFileRequestSchema, create(WriteFileRequestSchema, {
      msg: { case: "header", value: { sandbox, path, mode, makeParents: false } },
    })),
  ];
  const piece = 1 << 20;
  for (let off = 0; off < data.length; off += piece) {
    msgs.push(toBinary(WriteFileRequestSchema, create(WriteFileRequestSchema, {
      msg: { case: "data", value: data.subarray(off, off + piece) },
    })));
  }
  let size = 0;
  for (const m of msgs) size += 5 + m.length;
  const body = new Uint8Array(size);
  let at = 0;
  for (const m of msgs) {
    new DataView(body.buffer).setUint32(at + 1, m.length);
    body.set(m, at + 5);
    at += 5 + m.length;
  }
  const resp = await fetch("/sbx.v1.SandboxService/WriteFile", {
    method: "POST",
    headers: { "Content-Type": "application/connect+proto", "Connect-Protocol-Version": "1", ...authHeader() },
    body,
  });
  const buf = new Uint8Array(await resp.arrayBuffer());
  let written = 0n;
  for (let i = 0; i + 5 <= buf.length; ) {
    const flags = buf[i];
    const n = new DataView(buf.buffer, buf.byteOffset + i + 1, 4).getUint32(0);
    const payload = buf.subarray(i + 5, i + 5 + n);
    i += 5 + n;
    if (flags & 2) {
      const end = JSON.parse(new TextDecoder().decode(payload)) as { error?: { code?: string; message?: string } };
      if (end.error) {
        if (end.error.code === "unauthenticated") onUnauthenticated();
        throw new Error(`${end.error.code}: ${end.error.message ?? ""}`);
      }
    } else {
      written = fromBinary(WriteFileResponseSchema, payload).bytesWritten;
    }
  }
  if (!resp.ok && written === 0n) {
    if (resp.status === 401) onUnauthenticated();
    throw new Error(`upload failed: HTTP ${resp.status}`);
  }
  return written;
}

// readFile downloads a whole file with the ReadFile RPC.
export async function readFile(sandbox: string, path: string, signal?: AbortSignal): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let n = 0;
  for await (const chunk of sandboxes.readFile({ sandbox, path }, { signal })) {
    parts.push(chunk.data);
    n += chunk.data.length;
  }
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
