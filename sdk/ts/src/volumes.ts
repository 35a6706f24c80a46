import type { Volume as PbVolume } from "./gen/sbx/v1/volumes_pb.js";
import type { Client } from "./client.js";
import { call } from "./errors.js";
import { parseSize } from "./size.js";

/** A named volume: a directory that outlives sandboxes. */
export interface Volume {
  name: string;
  sizeBytes: number;
  usedBytes: number;
  createdAt: Date;
  /** Sandboxes that mount it. */
  sandboxes: string[];
}

function volumeOf(v: PbVolume | undefined): Volume {
  return {
    name: v?.name ?? "", sizeBytes: Number(v?.sizeBytes ?? 0), usedBytes: Number(v?.usedBytes ?? 0),
    createdAt: new Date(Number(v?.createdAtMs ?? 0)), sandboxes: v?.sandboxes ?? [],
  };
}

/** The daemon's volumes (client.volumes). */
export class Volumes {
  /** @internal */
  constructor(private readonly c: Client) {}

  /** Create a volume of at most size (bytes or "1G"; default the daemon's). */
  async create(name: string, opts: { size?: number | string } = {}): Promise<Volume> {
    const r = await call(`create volume ${name}`, () => this.c.rpc.volumes.createVolume({ name, sizeBytes: BigInt(parseSize(opts.size)) }));
    return volumeOf(r.volume);
  }

  async list(): Promise<Volume[]> {
    const r = await call("list volumes", () => this.c.rpc.volumes.listVolumes({}));
    return r.volumes.map(volumeOf);
  }

  async get(name: string): Promise<Volume> {
    const r = await call(`get volume ${name}`, () => this.c.rpc.volumes.getVolume({ name }));
    return volumeOf(r.volume);
  }

  async remove(name: string): Promise<void> {
    await call(`remove volume ${name}`, () => this.c.rpc.volumes.removeVolume({ name }));
  }
}
