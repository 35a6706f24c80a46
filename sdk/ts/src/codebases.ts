import { create } from "@bufbuild/protobuf";

import { CreateCodebaseRequestSchema, type Codebase as PbCodebase, type CreateCodebaseRequest } from "./gen/sbx/v1/codebase_pb.js";
import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";
import { codebaseTar, DEFAULT_MAX_FILE_BYTES, walkCodebase, type SkippedFile, type WalkOptions } from "./localtree.js";
import { concat } from "./process.js";

const CHUNK = 1 << 20;

/** A stored source tree that sandboxes mount copy-on-write. */
export interface Codebase {
  id: string;
  name: string;
  revision: number;
  fileCount: number;
  sizeBytes: number;
  createdAt: Date;
  updatedAt: Date;
  sandboxes: string[];
  /** What the upload left out (fromLocal's answer only; empty otherwise). */
  skipped: SkippedFile[];
}

/** What syncCodebase wrote back (or would, with dryRun). */
export interface SyncResult {
  codebase: string;
  written: string[];
  deleted: string[];
  conflicts: { path: string; reason: string }[];
  revision: number;
}

function codebaseOf(cb: PbCodebase | undefined): Codebase {
  return {
    id: cb?.id ?? "", name: cb?.name ?? "", revision: Number(cb?.revision ?? 0), fileCount: Number(cb?.fileCount ?? 0),
    sizeBytes: Number(cb?.sizeBytes ?? 0), createdAt: new Date(Number(cb?.createdAtMs ?? 0)),
    updatedAt: new Date(Number(cb?.updatedAtMs ?? 0)), sandboxes: cb?.sandboxes ?? [],
    skipped: (cb?.skipped ?? []).map((s) => ({ path: s.path, sizeBytes: Number(s.sizeBytes), reason: s.reason })),
  };
}

/** The caller's codebases (client.codebases). */
export class Codebases {
  /** @internal */
  constructor(private readonly c: Client) {}

  /** Create a codebase from a tar archive of the tree (e.g. `tar -c -C dir .`). */
  async create(name: string, tar: Uint8Array): Promise<Codebase> {
    async function* messages(): AsyncIterable<CreateCodebaseRequest> {
      yield create(CreateCodebaseRequestSchema, { msg: { case: "header", value: { name } } });
      for (let off = 0; off < tar.length; off += CHUNK) {
        yield create(CreateCodebaseRequestSchema, { msg: { case: "data", value: tar.subarray(off, off + CHUNK) } });
      }
    }
    const r = await call(`create codebase ${name}`, () => this.c.rpc.codebases.createCodebase(messages()));
    return codebaseOf(r.codebase);
  }

  /**
   * Upload the local directory `dir` as a new codebase, leaving out what
   * its .gitignore and .sandboxignore files and `ignore` exclude (those
   * files never leave this machine; gitignore(5) rules, as the Go and
   * Python SDKs apply them), files over `maxFileBytes` (default 10 MiB) and
   * sockets, FIFOs and devices. `skipped` in the answer lists every file
   * left out for size or type. Symlinks are uploaded as links and never
   * followed; a file or directory swapped for a symlink during the upload
   * fails it (ReplacedFileError), and so does an ignore file that is not a
   * regular file of the tree or is over 1 MiB (IgnoreFileError).
   */
  async fromLocal(dir: string, opts: WalkOptions & { name?: string } = {}): Promise<Codebase> {
    const { files, skipped } = walkCodebase(dir, opts);
    const maxFile = opts.maxFileBytes === undefined ? DEFAULT_MAX_FILE_BYTES : opts.maxFileBytes ?? 0;
    async function* messages(): AsyncIterable<CreateCodebaseRequest> {
      yield create(CreateCodebaseRequestSchema, { msg: { case: "header", value: {
        name: opts.name ?? "", maxFileBytes: BigInt(maxFile),
        skipped: skipped.map((s) => ({ path: s.path, sizeBytes: BigInt(s.sizeBytes), reason: s.reason })),
      } } });
      try {
        for (const data of codebaseTar(dir, files)) {
          yield create(CreateCodebaseRequestSchema, { msg: { case: "data", value: data } });
        }
      } catch (e) {
        // Abort the call: ending the request stream would let the daemon
        // take the tar so far for the whole tree and create the codebase.
        // (Throwing here would end it: the generator waits for the abort.)
        packErr = e;
        ac.abort(e);
        await new Promise(() => undefined);
      }
    }
    const ac = new AbortController();
    let packErr: unknown;
    let r;
    try {
      r = await call(`create codebase from ${dir}`, () => this.c.rpc.codebases.createCodebase(messages(), { signal: ac.signal }));
    } catch (e) {
      // A file the walk saw was swapped or shrank: that error, not the
      // stream's.
      throw packErr ?? e;
    }
    const cb = codebaseOf(r.codebase);
    const all = r.skipped.map((s) => ({ path: s.path, sizeBytes: Number(s.sizeBytes), reason: s.reason }));
    return { ...cb, skipped: all.length > 0 ? all : cb.skipped };
  }

  async list(): Promise<Codebase[]> {
    const r = await call("list codebases", () => this.c.rpc.codebases.listCodebases({}));
    return r.codebases.map(codebaseOf);
  }

  async get(ref: string): Promise<Codebase> {
    const r = await call(`get codebase ${ref}`, () => this.c.rpc.codebases.getCodebase({ codebase: ref }));
    return codebaseOf(r.codebase);
  }

  /** The codebase's current tree as a tar archive. */
  async download(ref: string): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    try {
      for await (const m of this.c.rpc.codebases.downloadCodebase({ codebase: ref })) {
        chunks.push(m.data);
      }
    } catch (e) {
      throw toSbxError(`download codebase ${ref}`, e);
    }
    return concat(chunks);
  }

  async delete(ref: string): Promise<void> {
    await call(`delete codebase ${ref}`, () => this.c.rpc.codebases.deleteCodebase({ codebase: ref }));
  }

  /** Write a sandbox's changes under a codebase mount back to the codebase. */
  async sync(sandbox: string, opts: { path?: string; dryRun?: boolean; force?: boolean } = {}): Promise<SyncResult> {
    const r = await call(`sync codebase of ${sandbox}`, () => this.c.rpc.codebases.syncCodebase({
      sandbox, path: opts.path ?? "", dryRun: opts.dryRun ?? false, force: opts.force ?? false,
    }));
    return {
      codebase: r.codebase, written: r.written, deleted: r.deleted, revision: Number(r.revision),
      conflicts: r.conflicts.map((c) => ({ path: c.path, reason: c.reason })),
    };
  }
}
