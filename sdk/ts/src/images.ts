import { readFileSync, realpathSync } from "node:fs";
import { dirname, resolve } from "node:path";

import { create } from "@bufbuild/protobuf";

import { ImportImageRequestSchema, type ImageInfo as PbImageInfo, type ImageProgress as PbImageProgress, type ImportImageRequest } from "./gen/sbx/v1/images_pb.js";
import type { Client } from "./client.js";
import { call, NotFoundError, PermissionDeniedError, toSbxError } from "./errors.js";
import { concat } from "./process.js";
import type { Recipe } from "./recipe.js";
import { DockerIgnore, packDir, readIgnoreFile } from "./tar.js";

const CHUNK = 1 << 20;

/** The largest Dockerfile build context sent (the daemon takes 48 MiB). */
export const MAX_CONTEXT_BYTES = 47 << 20;

/** One event of a pull or build, for a progress callback. */
export type ImageProgress =
  | { kind: "status"; status: string }
  | { kind: "layer"; digest: string; currentBytes: number; totalBytes: number; phase: string }
  | { kind: "step"; index: number; description: string; phase: string; durationMs: number }
  | { kind: "log"; data: Uint8Array; text: string }
  | { kind: "done"; image: ImageInfo };

function progressOf(m: PbImageProgress): ImageProgress | undefined {
  const ev = m.event;
  switch (ev.case) {
    case "status":
      return { kind: "status", status: ev.value };
    case "layer":
      return { kind: "layer", digest: ev.value.digest, currentBytes: Number(ev.value.currentBytes), totalBytes: Number(ev.value.totalBytes), phase: ev.value.phase };
    case "step":
      return { kind: "step", index: ev.value.index, description: ev.value.description, phase: ev.value.phase, durationMs: Number(ev.value.durationMs) };
    case "log":
      return { kind: "log", data: ev.value, text: new TextDecoder().decode(ev.value) };
    case "done":
      return { kind: "done", image: imageOf(ev.value) };
  }
  return undefined;
}

/** Options of images.build. */
export interface BuildOptions {
  /** Tag the result with this reference. */
  tag?: string;
  noCache?: boolean;
  /** Called with every step, log and status event. */
  progress?: (ev: ImageProgress) => void;
}

/** An image in the caller's store. */
export interface ImageInfo {
  ref: string;
  digest: string;
  sizeBytes: number;
  layers: number;
  createdAt: Date;
}

export function imageOf(i: PbImageInfo | undefined): ImageInfo {
  return {
    ref: i?.ref ?? "", digest: i?.digest ?? "", sizeBytes: Number(i?.sizeBytes ?? 0), layers: i?.layers ?? 0,
    createdAt: new Date(Number(i?.createdAtMs ?? 0)),
  };
}

/** The caller's image store (client.images). */
export class Images {
  /** @internal */
  constructor(private readonly c: Client) {}

  /** Pull an image from its registry; progress gets each event. */
  pull(ref: string, progress?: (ev: ImageProgress) => void): Promise<ImageInfo> {
    return this.follow(`pull ${ref}`, () => this.c.rpc.images.pullImage({ ref }, { timeoutMs: 0 }), progress);
  }

  private async follow(op: string, open: () => AsyncIterable<PbImageProgress>, progress?: (ev: ImageProgress) => void): Promise<ImageInfo> {
    try {
      for await (const m of open()) {
        const ev = progressOf(m);
        if (ev) {
          progress?.(ev);
        }
        if (ev?.kind === "done") {
          return ev.image;
        }
      }
    } catch (e) {
      throw toSbxError(op, e);
    }
    throw toSbxError(op, new Error("the stream ended before the image was done"));
  }

  /** Make sure ref is in the store, pulling it if not (null for "host" and
   * for a token that may not see images). */
  async ensure(ref: string, progress?: (ev: ImageProgress) => void): Promise<ImageInfo | null> {
    if (ref === "" || ref === "host") {
      return null;
    }
    try {
      return await this.get(ref);
    } catch (e) {
      if (e instanceof PermissionDeniedError) {
        return null;
      }
      if (e instanceof NotFoundError) {
        return this.pull(ref, progress);
      }
      throw e;
    }
  }

  /**
   * Build an image, one sandbox per step, each step cached: from a Recipe,
   * or from a Dockerfile (`{ dockerfile: path }`; its build context is
   * `context`, by default the Dockerfile's directory, sent without what
   * its .dockerignore lists; `buildArgs` set its ARGs).
   */
  async build(
    source: Recipe | { dockerfile: string; context?: string; buildArgs?: Record<string, string> },
    opts: BuildOptions = {},
  ): Promise<ImageInfo> {
    const base = { tag: opts.tag ?? "", noCache: opts.noCache ?? false };
    let req;
    if ("dockerfile" in source) {
      const text = readFileSync(source.dockerfile, "utf8");
      const ctx = source.context ?? dirname(resolve(source.dockerfile));
      // Never followed out of the context, a regular file, bounded.
      const ignore = readIgnoreFile(realpathSync(ctx), ".dockerignore") ?? "";
      req = { ...base, dockerfile: text, context: packDir(ctx, new DockerIgnore(ignore), MAX_CONTEXT_BYTES), buildArgs: source.buildArgs ?? {} };
    } else {
      req = { ...base, recipe: source.toProto() };
    }
    return this.follow(`build ${opts.tag || "image"}`, () => this.c.rpc.images.buildImage(req, { timeoutMs: 0 }), opts.progress);
  }

  /**
   * Import a docker-save or OCI-layout tarball (bytes, or the path of a
   * file). `tag` names a single-image archive; the names inside the
   * archive are applied only with useArchiveTags (and replace another
   * image's only with replaceArchiveTags).
   */
  async importTar(source: string | Uint8Array, opts: { tag?: string; useArchiveTags?: boolean; replaceArchiveTags?: boolean } = {}): Promise<ImageInfo[]> {
    const data = typeof source === "string" ? new Uint8Array(readFileSync(source)) : source;
    async function* messages(): AsyncIterable<ImportImageRequest> {
      yield create(ImportImageRequestSchema, { msg: { case: "header", value: {
        tag: opts.tag ?? "", useArchiveTags: opts.useArchiveTags ?? false, replaceArchiveTags: opts.replaceArchiveTags ?? false,
      } } });
      for (let off = 0; off < data.length; off += CHUNK) {
        yield create(ImportImageRequestSchema, { msg: { case: "data", value: data.subarray(off, off + CHUNK) } });
      }
    }
    const r = await call("import image", () => this.c.rpc.images.importImage(messages()));
    return r.images.map(imageOf);
  }

  /** The image as a docker-save tarball. */
  async export(ref: string): Promise<Uint8Array> {
    const chunks: Uint8Array[] = [];
    try {
      for await (const m of this.c.rpc.images.exportImage({ ref }, { timeoutMs: 0 })) {
        chunks.push(m.data);
      }
    } catch (e) {
      throw toSbxError(`export ${ref}`, e);
    }
    return concat(chunks);
  }

  /** Bytes the store's layers take on disk. */
  async diskUsage(): Promise<number> {
    const r = await call("list images", () => this.c.rpc.images.listImages({}));
    return Number(r.layersBytes);
  }

  async list(): Promise<ImageInfo[]> {
    const r = await call("list images", () => this.c.rpc.images.listImages({}));
    return r.images.map(imageOf);
  }

  async get(ref: string): Promise<ImageInfo> {
    const r = await call(`get image ${ref}`, () => this.c.rpc.images.getImage({ ref }));
    return imageOf(r.image);
  }

  /** Give the image source the reference target too. */
  async tag(source: string, target: string): Promise<void> {
    await call(`tag ${source}`, () => this.c.rpc.images.tagImage({ source, target }));
  }

  async remove(ref: string): Promise<void> {
    await call(`remove image ${ref}`, () => this.c.rpc.images.removeImage({ ref }));
  }

  /** Remove unused layers; returns the bytes freed. */
  async prune(): Promise<number> {
    const r = await call("prune images", () => this.c.rpc.images.pruneImages({}));
    return Number(r.freedBytes);
  }
}
