// Streaming file objects over a sandbox's files: sandbox.open(path, mode).
import { Readable, Writable } from "node:stream";

import { create } from "@bufbuild/protobuf";

import { WriteFileRequestSchema, type WriteFileRequest } from "./gen/sbx/v1/files_pb.js";
import type { Client } from "./client.js";
import { AlreadyExistsError, call } from "./errors.js";
import type { Files } from "./files.js";

/** Bytes of file data per message (as the Go and Python SDKs). */
const CHUNK = 1 << 20;

/** Modes of sandbox.open: read, write (truncate), append, exclusive create;
 * "b" or "t" may follow (they change nothing: data are bytes, text() decodes). */
export type OpenMode = "r" | "w" | "a" | "x" | "rb" | "wb" | "ab" | "xb" | "rt" | "wt" | "at" | "xt";

/** parseMode splits a mode like Python's open()'s into r, w, a or x. */
export function parseMode(mode: string): "r" | "w" | "a" | "x" {
  const kinds = [...mode].filter((c) => "rwax".includes(c));
  if (kinds.length !== 1 || new Set(mode).size !== mode.length || [...mode].some((c) => !"rwaxbt+".includes(c)) ||
      (mode.includes("b") && mode.includes("t"))) {
    throw new RangeError(`open: invalid mode ${JSON.stringify(mode)}: want r, w, a or x, optionally with b or t`);
  }
  if (mode.includes("+")) {
    throw new RangeError(`open: mode ${JSON.stringify(mode)}: read-write modes need random access, and sandbox files stream; ` +
      "open the file once to read it and once to write it (or use files.read and files.write)");
  }
  return kinds[0] as "r" | "w" | "a" | "x";
}

/**
 * A file of a sandbox opened with sandbox.open: it streams. In mode "r" it
 * is read from the sandbox as you consume it (an async iterable of chunks,
 * a web ReadableStream, a Node Readable, or read()/text() for the rest).
 * In "w", "a" and "x" what you write() is sent as you write it, with
 * backpressure; "w" and "x" write to a temporary file that replaces the
 * target at close() (it appears whole or not at all; abort() leaves the
 * target as open() left it: empty), "a" appends as the data arrive.
 * Always close() (or abort()) a file opened for writing.
 */
export class SandboxFile implements AsyncIterable<Uint8Array> {
  private readonly ac = new AbortController();
  private closed = false;
  private consumed = false;
  // Writing: the chunk waiting for the request stream to take it, who
  // waits for that, and how the call ended.
  private slot?: { data: Uint8Array | null; taken: () => void };
  private pull?: () => void;
  private done?: Promise<number>;
  private failure?: unknown;
  private settled = false;
  // Writes and the close, one after another even when not awaited.
  private queue: Promise<unknown> = Promise.resolve();

  /** @internal */
  constructor(
    private readonly c: Client,
    private readonly files: Files,
    private readonly sandbox: string,
    /** The path in the sandbox. */
    readonly name: string,
    /** The mode it was opened with (one of r, w, a, x). */
    readonly mode: "r" | "w" | "a" | "x",
    perm: number,
  ) {
    if (mode !== "r") {
      this.startWrite(perm);
    }
  }

  /** @internal */
  static async open(c: Client, files: Files, sandbox: string, path: string, mode: string, perm: number): Promise<SandboxFile> {
    const kind = parseMode(mode);
    if (kind === "r") {
      await files.stat(path); // NotFoundError now, like open()
    } else if (kind === "x" && (await files.exists(path))) {
      throw new AlreadyExistsError("already_exists", `open ${path} in the sandbox: it exists (mode x)`);
    }
    if (kind === "w" || kind === "x") {
      await files.write(path, new Uint8Array(), { mode: perm }); // like open(): there (empty) from here on
    } else if (kind === "a") {
      await files.write(path, new Uint8Array(), { mode: perm, append: true });
    }
    return new SandboxFile(c, files, sandbox, path, kind, perm);
  }

  private need(reading: boolean): void {
    if (this.closed) {
      throw new Error(`${this.name}: the file is closed`);
    }
    if (reading !== (this.mode === "r")) {
      throw new Error(`${this.name}: not ${reading ? "readable" : "writable"} (mode ${this.mode})`);
    }
  }

  // -- reading -----------------------------------------------------------

  /** The file's data as they come from the sandbox (mode r; once). */
  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    this.need(true);
    if (this.consumed) {
      throw new Error(`${this.name}: already read (a stream is read once)`);
    }
    this.consumed = true;
    try {
      yield* this.files.stream(this.name, { signal: this.ac.signal });
    } finally {
      this.closed = true;
    }
  }

  /** The rest of the file (mode r). */
  async read(): Promise<Uint8Array> {
    const parts: Buffer[] = [];
    for await (const b of this) {
      parts.push(Buffer.from(b.buffer, b.byteOffset, b.length));
    }
    return new Uint8Array(Buffer.concat(parts));
  }

  /** The rest of the file as UTF-8 text (mode r). */
  async text(): Promise<string> {
    return new TextDecoder().decode(await this.read());
  }

  /** A web ReadableStream of the file (mode r); cancelling it stops the read. */
  get readable(): ReadableStream<Uint8Array> {
    this.need(true);
    const it = this[Symbol.asyncIterator]();
    return new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        const r = await it.next();
        if (r.done) {
          ctrl.close();
        } else {
          ctrl.enqueue(r.value);
        }
      },
      cancel: async () => {
        this.ac.abort();
        await it.return(undefined);
      },
    });
  }

  // -- writing -----------------------------------------------------------

  private startWrite(perm: number): void {
    const { sandbox, name: path } = this;
    const append = this.mode === "a";
    const self = this;
    async function* messages(): AsyncIterable<WriteFileRequest> {
      yield create(WriteFileRequestSchema, { msg: { case: "header", value: { sandbox, path, mode: perm, append, makeParents: false } } });
      for (;;) {
        const slot = await new Promise<NonNullable<SandboxFile["slot"]>>((resolve) => {
          if (self.slot) {
            resolve(self.slot);
          } else {
            self.pull = () => resolve(self.slot!);
          }
        });
        self.slot = undefined;
        self.pull = undefined;
        slot.taken();
        if (slot.data === null) {
          return;
        }
        yield create(WriteFileRequestSchema, { msg: { case: "data", value: slot.data } });
      }
    }
    this.done = call(`write ${path}`, () => this.c.rpc.sandboxes.writeFile(messages(), { signal: this.ac.signal }))
      .then((r) => Number(r.bytesWritten));
    this.done.then(() => undefined, (e) => {
      this.failure = e;
    }).finally(() => {
      this.settled = true;
      this.slot?.taken(); // a writer waiting on a call that ended
    });
  }

  private async send(data: Uint8Array | null): Promise<void> {
    if (this.settled) {
      // The call ended early (an error, an abort): say why.
      await this.done;
      throw new Error(`write ${this.name}: the write stream has ended`);
    }
    await new Promise<void>((taken) => {
      this.slot = { data, taken };
      this.pull?.();
    });
    if (this.failure !== undefined) {
      throw this.failure;
    }
  }

  /** Send data (a string is UTF-8) to the file (mode w, a or x); resolves
   * once the stream has taken it. */
  async write(data: string | Uint8Array): Promise<void> {
    this.need(false);
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.serial(async () => {
      for (let off = 0; off < bytes.length; off += CHUNK) {
        await this.send(bytes.subarray(off, off + CHUNK));
      }
    });
  }

  private serial<T>(f: () => Promise<T>): Promise<T> {
    const p = this.queue.then(f);
    this.queue = p.catch(() => undefined);
    return p;
  }

  /** A web WritableStream into the file (mode w, a or x): closing it closes the file. */
  get writable(): WritableStream<string | Uint8Array> {
    this.need(false);
    return new WritableStream<string | Uint8Array>({
      write: (chunk) => this.write(chunk),
      close: async () => {
        await this.close();
      },
      abort: (reason) => this.abort(reason),
    });
  }

  // -- both ----------------------------------------------------------------

  /** A Node stream of the file: a Readable in mode r, else a Writable
   * (ending it closes the file; destroying it with an error aborts). */
  nodeStream(): Readable | Writable {
    if (this.mode === "r") {
      this.need(true);
      return Readable.from(this, { objectMode: false });
    }
    this.need(false);
    return new Writable({
      write: (chunk: Buffer, _enc, cb) => {
        this.write(chunk).then(() => cb(), cb);
      },
      final: (cb) => {
        this.close().then(() => cb(), cb);
      },
      destroy: (err, cb) => {
        if (err && !this.closed) {
          this.abort(err).then(() => cb(err), () => cb(err));
        } else {
          cb(err);
        }
      },
    });
  }

  /**
   * Finish: for a file opened for writing, send the end and wait for the
   * sandbox to have it (the bytes this stream wrote are returned; a write
   * that failed throws here); for reading, stop the read.
   */
  async close(): Promise<number> {
    if (this.closed) {
      return 0;
    }
    if (this.mode === "r") {
      this.closed = true;
      this.ac.abort();
      return 0;
    }
    this.closed = true;
    return this.serial(async () => {
      if (!this.settled) {
        await this.send(null);
      }
      return this.done!;
    });
  }

  /** Give up: a file opened with w or x keeps what open() left (empty),
   * not a part of what was written; appended data stay. */
  async abort(reason?: unknown): Promise<void> {
    if (this.closed) {
      return;
    }
    this.closed = true;
    this.ac.abort(reason);
    await this.done?.catch(() => undefined);
  }
}
