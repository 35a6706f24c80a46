import { constants } from "node:fs";
import { open, rename, unlink } from "node:fs/promises";

import { create } from "@bufbuild/protobuf";

import {
  FileType, UploadTarRequestSchema, WriteFileRequestSchema, type FileInfo as PbFileInfo, type UploadTarRequest, type WriteFileRequest,
} from "./gen/sbx/v1/files_pb.js";
import type { Client } from "./client.js";
import { call, NotFoundError, toSbxError } from "./errors.js";
import { concat } from "./process.js";
import { packDir, safeExtract } from "./tar.js";

/** Bytes of file data per uploaded message (as the Go and Python SDKs). */
const CHUNK = 1 << 20;

/** One entry of a directory listing. */
export interface FileInfo {
  path: string;
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  mtime: Date;
  symlinkTarget: string;
  uid: number;
  gid: number;
}

function typeName(t: FileType): FileInfo["type"] {
  switch (t) {
    case FileType.FILE:
      return "file";
    case FileType.DIR:
      return "dir";
    case FileType.SYMLINK:
      return "symlink";
    default:
      return "other";
  }
}

export function fileInfoOf(f: PbFileInfo): FileInfo {
  return {
    path: f.path, name: f.name, type: typeName(f.type), size: Number(f.size), mode: f.mode,
    mtime: new Date(Number(f.mtimeMs)), symlinkTarget: f.symlinkTarget, uid: f.uid, gid: f.gid,
  };
}

/** A change watch() saw in a directory. */
export interface WatchEvent {
  type: "create" | "write" | "remove";
  path: string;
  /** The entry as listed (the last listing's, for a remove). */
  info: FileInfo;
}

/** A sandbox's filesystem (sandbox.files). */
export class Files {
  /** @internal */
  constructor(private readonly c: Client, private readonly sandbox: string) {}

  /** Read a file (or `length` bytes of it from `offset`; 0: to the end). */
  async read(path: string, opts: { offset?: number; length?: number } = {}): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    try {
      for await (const m of this.c.rpc.sandboxes.readFile({
        sandbox: this.sandbox, path, offset: BigInt(opts.offset ?? 0), length: BigInt(opts.length ?? 0),
      })) {
        chunks.push(m.data);
      }
    } catch (e) {
      throw toSbxError(`read ${path}`, e);
    }
    return concat(chunks);
  }

  /** Stream a file (or `length` bytes of it from `offset`) as it is read,
   * in chunks; abort `signal` to stop. */
  async *stream(path: string, opts: { offset?: number; length?: number; signal?: AbortSignal } = {}): AsyncGenerator<Uint8Array> {
    try {
      for await (const m of this.c.rpc.sandboxes.readFile({
        sandbox: this.sandbox, path, offset: BigInt(opts.offset ?? 0), length: BigInt(opts.length ?? 0),
      }, { signal: opts.signal })) {
        yield m.data;
      }
    } catch (e) {
      if (opts.signal?.aborted) {
        return;
      }
      throw toSbxError(`read ${path}`, e);
    }
  }

  /**
   * Copy a file of the sandbox to the local path `localPath`, streaming
   * (a file of any size takes little memory): written to a temporary file
   * beside it ("<localPath>.sbx-partial", never through a symlink there)
   * and renamed into place when complete; runs of zeros stay holes.
   * Returns its size.
   */
  async downloadFile(remotePath: string, localPath: string): Promise<number> {
    const tmp = `${localPath}.sbx-partial`;
    const fh = await open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW, 0o644);
    let n = 0;
    try {
      for await (const data of this.stream(remotePath)) {
        if (!data.every((b) => b === 0)) {
          for (let w = 0; w < data.length;) {
            w += (await fh.write(data, w, data.length - w, n + w)).bytesWritten;
          }
        }
        n += data.length;
      }
      await fh.truncate(n);
      await fh.close();
      await rename(tmp, localPath);
    } catch (e) {
      await fh.close().catch(() => undefined);
      await unlink(tmp).catch(() => undefined);
      throw e;
    }
    return n;
  }

  /** Copy the local file `localPath` into the sandbox, streaming (with its
   * permission bits unless `mode`); returns the bytes written. */
  async uploadFile(localPath: string, remotePath: string, opts: { mode?: number } = {}): Promise<number> {
    const fh = await open(localPath, "r");
    try {
      const mode = opts.mode ?? (await fh.stat()).mode & 0o777;
      const sandbox = this.sandbox;
      // A read that fails aborts the call: ending the request stream would
      // make what was sent so far the whole file.
      const ac = new AbortController();
      let readErr: unknown;
      async function* messages(): AsyncIterable<WriteFileRequest> {
        yield create(WriteFileRequestSchema, {
          msg: { case: "header", value: { sandbox, path: remotePath, mode, append: false, makeParents: true } },
        });
        for (;;) {
          const buf = new Uint8Array(CHUNK);
          let bytesRead: number;
          try {
            ({ bytesRead } = await fh.read(buf, 0, CHUNK, null));
          } catch (e) {
            readErr = e;
            ac.abort(e); // (throwing here would end the stream: wait for the abort)
            await new Promise(() => undefined);
            return;
          }
          if (bytesRead === 0) {
            return;
          }
          yield create(WriteFileRequestSchema, { msg: { case: "data", value: buf.subarray(0, bytesRead) } });
        }
      }
      try {
        const r = await call(`upload ${localPath} to ${remotePath}`, () => this.c.rpc.sandboxes.writeFile(messages(), { signal: ac.signal }));
        return Number(r.bytesWritten);
      } catch (e) {
        throw readErr ?? e;
      }
    } finally {
      await fh.close();
    }
  }

  /** Read a file as UTF-8 text. */
  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  /** Write a file (created with mode, default 0o644; parent directories too), returning the bytes written. */
  async write(path: string, data: string | Uint8Array, opts: { mode?: number; append?: boolean } = {}): Promise<number> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    const sandbox = this.sandbox;
    async function* messages(): AsyncIterable<WriteFileRequest> {
      yield create(WriteFileRequestSchema, {
        msg: { case: "header", value: { sandbox, path, mode: opts.mode ?? 0o644, append: opts.append ?? false, makeParents: true } },
      });
      for (let off = 0; off < bytes.length; off += CHUNK) {
        yield create(WriteFileRequestSchema, { msg: { case: "data", value: bytes.subarray(off, off + CHUNK) } });
      }
    }
    const r = await call(`write ${path}`, () => this.c.rpc.sandboxes.writeFile(messages()));
    return Number(r.bytesWritten);
  }

  /** List a directory (recursively up to maxDepth levels; 0: no bound). */
  async list(path = ".", opts: { recursive?: boolean; maxDepth?: number } = {}): Promise<FileInfo[]> {
    const r = await call(`list ${path}`, () =>
      this.c.rpc.sandboxes.listDir({ sandbox: this.sandbox, path, recursive: opts.recursive ?? false, maxDepth: opts.maxDepth ?? 0 }));
    return r.entries.map(fileInfoOf);
  }

  /** Describe a path (without following a final symlink). */
  async stat(path: string): Promise<FileInfo> {
    const r = await call(`stat ${path}`, () => this.c.rpc.sandboxes.stat({ sandbox: this.sandbox, path }));
    if (!r.info) {
      throw new NotFoundError("not_found", `stat ${path}: no such file`);
    }
    return fileInfoOf(r.info);
  }

  /** Whether path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof NotFoundError) {
        return false;
      }
      throw e;
    }
  }

  /** Make a directory (and its parents unless parents is false). */
  async makeDir(path: string, opts: { parents?: boolean; mode?: number } = {}): Promise<void> {
    await call(`mkdir ${path}`, () => this.c.rpc.sandboxes.makeDir({ sandbox: this.sandbox, path, parents: opts.parents ?? true, mode: opts.mode ?? 0 }));
  }

  /** Remove a file, or a directory tree with recursive. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await call(`remove ${path}`, () => this.c.rpc.sandboxes.remove({ sandbox: this.sandbox, path, recursive: opts.recursive ?? false }));
  }

  /** Rename (move) a path. */
  async rename(from: string, to: string): Promise<void> {
    await call(`rename ${from}`, () => this.c.rpc.sandboxes.rename({ sandbox: this.sandbox, from, to }));
  }

  /** Extract a tar archive into remoteDir (created if missing). */
  async uploadTar(remoteDir: string, tar: Uint8Array): Promise<{ files: number; bytes: number }> {
    const sandbox = this.sandbox;
    async function* messages(): AsyncIterable<UploadTarRequest> {
      yield create(UploadTarRequestSchema, { msg: { case: "header", value: { sandbox, path: remoteDir } } });
      for (let off = 0; off < tar.length; off += CHUNK) {
        yield create(UploadTarRequestSchema, { msg: { case: "data", value: tar.subarray(off, off + CHUNK) } });
      }
    }
    const r = await call(`upload tar to ${remoteDir}`, () => this.c.rpc.sandboxes.uploadTar(messages()));
    return { files: Number(r.files), bytes: Number(r.bytes) };
  }

  /** Copy the contents of localDir into remoteDir (created if missing); returns the files written. */
  async uploadDir(localDir: string, remoteDir: string): Promise<number> {
    return (await this.uploadTar(remoteDir, packDir(localDir))).files;
  }

  /** A tar of remotePath: a directory's contents, or one file. */
  async downloadTar(remotePath: string): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    try {
      for await (const m of this.c.rpc.sandboxes.downloadTar({ sandbox: this.sandbox, path: remotePath })) {
        chunks.push(m.data);
      }
    } catch (e) {
      throw toSbxError(`download ${remotePath}`, e);
    }
    return concat(chunks);
  }

  /**
   * Copy the contents of remoteDir into localDir (created if missing);
   * returns the entries extracted. The sandbox wrote that tree, so the
   * extraction is safe: entries with absolute paths or "..", device nodes,
   * FIFOs and entries below a symlink throw UnsafeArchiveError; symlinks
   * whose target leaves localDir are not created and are listed in
   * `skipped`.
   */
  async downloadDir(remoteDir: string, localDir: string): Promise<{ entries: number; skipped: string[] }> {
    const skipped: string[] = [];
    const entries = safeExtract(await this.downloadTar(remoteDir), localDir, skipped);
    return { entries, skipped };
  }

  /**
   * Watch a directory (its subtree with recursive): an async iterator of
   * the creates, writes (size or mtime changed) and removes seen. The sbx
   * API has no change stream, so this lists the directory every
   * `intervalMs` (default 500, at least 100) and reports the differences,
   * as sbx's E2B watchDir does: a change undone within one interval is not
   * seen, and a rename is a remove and a create. It ends when `signal`
   * aborts (or the caller stops iterating); a missing directory throws.
   * `onReady` is called once the first listing is taken: changes after it
   * are reported.
   */
  async *watch(path: string, opts: { recursive?: boolean; intervalMs?: number; signal?: AbortSignal; onReady?: () => void } = {}): AsyncGenerator<WatchEvent> {
    const interval = opts.intervalMs ?? 500;
    if (!(interval >= 100)) {
      throw new RangeError(`watch: intervalMs ${interval}: want 100 or more`);
    }
    const snapshot = async () => new Map((await this.list(path, { recursive: opts.recursive ?? false })).map((f) => [f.path, f]));
    let before = await snapshot();
    opts.onReady?.();
    while (!opts.signal?.aborted) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, interval);
        opts.signal?.addEventListener("abort", () => {
          clearTimeout(t);
          resolve();
        }, { once: true });
      });
      if (opts.signal?.aborted) {
        return;
      }
      const now = await snapshot();
      for (const [p, f] of now) {
        const old = before.get(p);
        if (!old) {
          yield { type: "create", path: p, info: f };
        } else if (old.type !== f.type || (f.type !== "dir" && (old.size !== f.size || old.mtime.getTime() !== f.mtime.getTime()))) {
          // (A directory's own mtime moves with its entries, reported themselves.)
          yield { type: "write", path: p, info: f };
        }
      }
      for (const [p, f] of before) {
        if (!now.has(p)) {
          yield { type: "remove", path: p, info: f };
        }
      }
      before = now;
    }
  }
}
