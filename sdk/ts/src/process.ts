import { create } from "@bufbuild/protobuf";

import { ExecInputSchema, type ExecInput, type ExecOutput, type ExecRequest } from "./gen/sbx/v1/process_pb.js";
import { toSbxError } from "./errors.js";

/** How a command ended. */
export interface ExitStatus {
  exitCode: number;
  /** The signal that killed it (0: none). */
  signal: number;
  timedOut: boolean;
  /** Killed by the sandbox's memory limit (a heuristic; see ExecExited in api/proto). */
  oomKilled: boolean;
  /** It failed while the sandbox's pids limit refused a fork. */
  pidsLimitHit: boolean;
  /** Why it could not run or was stopped, if it was. */
  error: string;
  durationMs: number;
}

/** A finished command with its output. */
export interface CommandResult extends ExitStatus {
  stdout: string;
  stderr: string;
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
}

/** Output callbacks: called with each chunk as it arrives. */
export interface OutputHandlers {
  onStdout?: (chunk: Uint8Array) => void;
  onStderr?: (chunk: Uint8Array) => void;
}

export function concat(chunks: Uint8Array[]): Uint8Array {
  const n = chunks.reduce((a, c) => a + c.length, 0);
  const out = new Uint8Array(n);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.length;
  }
  return out;
}

const decoder = new TextDecoder();

export function exitStatusOf(ev: {
  exitCode: number; signal: number; timedOut: boolean; error: string; durationMs: bigint; oomKilled: boolean; pidsLimitHit: boolean;
}): ExitStatus {
  return {
    exitCode: ev.exitCode, signal: ev.signal, timedOut: ev.timedOut, oomKilled: ev.oomKilled, pidsLimitHit: ev.pidsLimitHit,
    error: ev.error, durationMs: Number(ev.durationMs),
  };
}

/** collect reads an Exec output stream to its end. */
export async function collect(op: string, stream: AsyncIterable<ExecOutput>, h: OutputHandlers): Promise<CommandResult & { pid: number }> {
  const out: Uint8Array[] = [];
  const err: Uint8Array[] = [];
  let status: ExitStatus | undefined;
  let pid = 0;
  try {
    for await (const m of stream) {
      const ev = m.event;
      switch (ev.case) {
        case "started":
          pid = ev.value.pid;
          break;
        case "stdout":
          out.push(ev.value);
          h.onStdout?.(ev.value);
          break;
        case "stderr":
          err.push(ev.value);
          h.onStderr?.(ev.value);
          break;
        case "exited":
          status = exitStatusOf(ev.value);
          break;
      }
    }
  } catch (e) {
    throw toSbxError(op, e);
  }
  if (!status) {
    throw toSbxError(op, new Error("the output stream ended before the command did"));
  }
  const stdoutBytes = concat(out);
  const stderrBytes = concat(err);
  return { ...status, pid, stdoutBytes, stderrBytes, stdout: decoder.decode(stdoutBytes), stderr: decoder.decode(stderrBytes) };
}

/** A queue of messages for a client stream: push, end, iterate once. */
class InputQueue implements AsyncIterable<ExecInput> {
  private items: ExecInput[] = [];
  private ended = false;
  private wake?: () => void;

  push(m: ExecInput): void {
    if (this.ended) {
      throw new Error("the process's input is closed");
    }
    this.items.push(m);
    this.wake?.();
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ExecInput> {
    for (;;) {
      const m = this.items.shift();
      if (m) {
        yield m;
        continue;
      }
      if (this.ended) {
        return;
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

/**
 * A running command with open stdin (ExecInteractive over HTTP/2). Output
 * goes to the handlers as it arrives and is collected for wait().
 */
export class Process {
  private readonly input = new InputQueue();
  private readonly done: Promise<CommandResult & { pid: number }>;
  private readonly abort = new AbortController();
  // Output so far, for output(): what has come and a wake-up for more.
  private readonly seen: { stream: "stdout" | "stderr"; data: Uint8Array }[] = [];
  private ended = false;
  private wake: (() => void)[] = [];

  /** @internal */
  constructor(
    start: ExecRequest,
    open: (input: AsyncIterable<ExecInput>, signal: AbortSignal) => AsyncIterable<ExecOutput>,
    h: OutputHandlers,
  ) {
    this.input.push(create(ExecInputSchema, { event: { case: "start", value: start } }));
    const note = (stream: "stdout" | "stderr", data: Uint8Array) => {
      this.seen.push({ stream, data });
      this.wake.splice(0).forEach((w) => w());
    };
    const handlers: OutputHandlers = {
      onStdout: (c) => (note("stdout", c), h.onStdout?.(c)),
      onStderr: (c) => (note("stderr", c), h.onStderr?.(c)),
    };
    this.done = collect("exec", open(this.input, this.abort.signal), handlers).finally(() => {
      this.input.end();
      this.ended = true;
      this.wake.splice(0).forEach((w) => w());
    });
    // wait() reports the error; this keeps an unawaited failure from
    // becoming an unhandled rejection.
    this.done.catch(() => undefined);
  }

  /** Send data to the command's stdin. */
  writeStdin(data: string | Uint8Array): void {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    this.input.push(create(ExecInputSchema, { event: { case: "stdin", value: bytes } }));
  }

  /** Close the command's stdin (it sees end of file). */
  closeStdin(): void {
    this.input.push(create(ExecInputSchema, { event: { case: "stdinClose", value: true } }));
  }

  /** Send a signal (default SIGKILL, 9) to the command. */
  kill(signal = 9): void {
    this.input.push(create(ExecInputSchema, { event: { case: "signal", value: signal } }));
  }

  /**
   * Its output from the start, then as it comes, until it ends:
   * `for await (const o of p.output()) process.stdout.write(o.text)`.
   * Iterating again starts from the start again.
   */
  async *output(): AsyncGenerator<{ stream: "stdout" | "stderr"; data: Uint8Array; text: string }> {
    const dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    for (let i = 0; ; i++) {
      while (i >= this.seen.length && !this.ended) {
        await new Promise<void>((r) => this.wake.push(r));
      }
      if (i >= this.seen.length) {
        return;
      }
      const { stream, data } = this.seen[i];
      yield { stream, data, text: dec[stream].decode(data, { stream: true }) };
    }
  }

  /** Wait for the command to end and return its status and output. */
  wait(): Promise<CommandResult & { pid: number }> {
    return this.done;
  }

  /** Drop the call (the daemon kills the command). */
  cancel(): void {
    this.abort.abort();
  }
}
