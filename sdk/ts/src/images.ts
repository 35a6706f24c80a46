import type { ImageInfo as PbImageInfo } from "./gen/sbx/v1/images_pb.js";
import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";

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

  /** Pull an image from its registry; progress gets each status line. */
  async pull(ref: string, progress?: (status: string) => void): Promise<ImageInfo> {
    let done: ImageInfo | undefined;
    try {
      for await (const m of this.c.rpc.images.pullImage({ ref })) {
        const ev = m.event;
        if (ev.case === "status") {
          progress?.(ev.value);
        } else if (ev.case === "done") {
          done = imageOf(ev.value);
        }
      }
    } catch (e) {
      throw toSbxError(`pull ${ref}`, e);
    }
    if (!done) {
      throw toSbxError(`pull ${ref}`, new Error("the stream ended before the pull did"));
    }
    return done;
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
