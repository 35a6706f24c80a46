import { create } from "@bufbuild/protobuf";

import { CreateCodebaseRequestSchema, type Codebase as PbCodebase, type CreateCodebaseRequest } from "./gen/sbx/v1/codebase_pb.js";
import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";
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
