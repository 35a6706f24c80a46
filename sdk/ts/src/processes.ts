import { create } from "@bufbuild/protobuf";

import { ExecRequestSchema } from "./gen/sbx/v1/process_pb.js";
import type { ProcessInfo } from "./gen/sbx/v1/processes_pb.js";
import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";
import { exitStatusOf, type ExitStatus } from "./process.js";

/** The most stdin one sendStdin message carries (the daemon's message bound). */
const MAX_STDIN = 4 << 20;

const SIGNALS: Record<string, number> = { HUP: 1, INT: 2, QUIT: 3, KILL: 9, USR1: 10, USR2: 12, TERM: 15, CONT: 18, STOP: 19 };

/** signalNumber turns 15, "TERM" or "SIGTERM" into a signal number. */
export function signalNumber(sig: number | string): number {
  if (typeof sig === "string") {
    const name = sig.toUpperCase().replace(/^SIG/, "");
    const n = SIGNALS[name];
    if (n === undefined) {
      throw new RangeError(`unknown signal ${JSON.stringify(sig)}: use a number or one of ${Object.keys(SIGNALS).join(", ")}`);
    }
    return n;
  }
  if (!Number.isInteger(sig) || sig < 1 || sig > 64) {
    throw new RangeError(`signal ${sig}: want 1 to 64`);
  }
  return sig;
}

/** A piece of a background process's output. */
export interface ProcessOutput {
  stream: "stdout" | "stderr";
  data: Uint8Array;
  text: string;
}

/** Options of processes.start. */
export interface StartProcessOptions {
  env?: Record<string, string>;
  /** Working directory. */
  cwd?: string;
  /** Seconds after which its process group is killed. */
  timeout?: number;
  /** true keeps stdin open for sendStdin; a string or bytes are written
   * first (then stdin is closed, unless pty). */
  stdin?: boolean | string | Uint8Array;
  user?: string;
  /** Run under a pseudo-terminal of rows × cols (stdin stays open; stdout
   * carries the terminal's output). */
  pty?: boolean;
  rows?: number;
  cols?: number;
  /** A label to find it by (processes.connect(tag)). */
  tag?: string;
}

/**
 * A background process in a sandbox, as last seen: a command that outlives
 * the call (and the client) that started it. The sandbox's agent keeps it,
 * the newest output of each stream and its exit status.
 */
export class BackgroundProcess {
  id = "";
  pid = 0;
  tag = "";
  command: string[] = [];
  pty = false;
  stdinOpen = false;
  startedAt = new Date(0);
  running = false;
  exitStatus?: ExitStatus;
  /** Bytes of output the sandbox no longer keeps (it keeps the newest). */
  droppedStdout = 0;
  droppedStderr = 0;
  env: Record<string, string> = {};
  workdir = "";

  readonly #c: Client;

  /** @internal */
  constructor(c: Client, readonly sandbox: string, info: ProcessInfo | undefined) {
    this.#c = c;
    this.update(info);
  }

  private update(info: ProcessInfo | undefined): void {
    if (!info) {
      return;
    }
    this.id = info.id;
    this.pid = info.pid;
    this.tag = info.tag;
    this.command = info.command;
    this.pty = info.tty;
    this.stdinOpen = info.stdinOpen;
    this.startedAt = new Date(Number(info.startedMs));
    this.running = info.running;
    this.exitStatus = info.exited ? exitStatusOf(info.exited) : undefined;
    this.droppedStdout = Number(info.droppedStdoutBytes);
    this.droppedStderr = Number(info.droppedStderrBytes);
    this.env = info.env;
    this.workdir = info.workdir;
  }

  /** The exit code if it had exited when last seen. */
  get returncode(): number | undefined {
    return this.exitStatus?.exitCode;
  }

  /**
   * Its output from the oldest kept byte, then (with follow, the default)
   * as it comes, until it exits: `for await (const o of p.output())`.
   * `tail` replays only the last lines kept.
   */
  async *output(opts: { follow?: boolean; tail?: number } = {}): AsyncGenerator<ProcessOutput> {
    const dec = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    try {
      for await (const m of this.#c.rpc.processes.connectProcess(
        { sandbox: this.sandbox, process: this.id, follow: opts.follow ?? true, tail: opts.tail },
        { timeoutMs: 0 },
      )) {
        const ev = m.event;
        if (ev.case === "stdout" || ev.case === "stderr") {
          yield { stream: ev.case, data: ev.value, text: dec[ev.case].decode(ev.value, { stream: true }) };
        } else if (ev.case === "process") {
          this.update(ev.value);
        } else if (ev.case === "dropped") {
          this.droppedStdout = Math.max(this.droppedStdout, Number(ev.value.stdoutBytes));
          this.droppedStderr = Math.max(this.droppedStderr, Number(ev.value.stderrBytes));
        } else if (ev.case === "exited") {
          this.exitStatus = exitStatusOf(ev.value);
          this.running = false;
          return;
        }
      }
    } catch (e) {
      throw toSbxError(`connect process ${this.id}`, e);
    }
  }

  /** What it has printed so far (what the sandbox kept), without waiting. */
  async collectOutput(opts: { tail?: number } = {}): Promise<{ stdout: string; stderr: string }> {
    let stdout = "";
    let stderr = "";
    for await (const o of this.output({ follow: false, tail: opts.tail })) {
      if (o.stream === "stdout") {
        stdout += o.text;
      } else {
        stderr += o.text;
      }
    }
    return { stdout, stderr };
  }

  /** Write to its stdin (started with stdin: true or pty). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const b = typeof data === "string" ? new TextEncoder().encode(data) : data;
    let off = 0;
    do {
      const part = b.subarray(off, off + MAX_STDIN);
      await call(`send stdin to ${this.id}`, () =>
        this.#c.rpc.processes.sendProcessInput({ sandbox: this.sandbox, process: this.id, stdin: part }));
      off += MAX_STDIN;
    } while (off < b.length);
  }

  /** Give it end-of-file on stdin (^D under a pty). */
  async closeStdin(): Promise<void> {
    await call(`close stdin of ${this.id}`, () =>
      this.#c.rpc.processes.sendProcessInput({ sandbox: this.sandbox, process: this.id, stdinClose: true }));
    this.stdinOpen = false;
  }

  /** Resize its pseudo-terminal. */
  async resize(rows: number, cols: number): Promise<void> {
    await call(`resize ${this.id}`, () =>
      this.#c.rpc.processes.sendProcessInput({ sandbox: this.sandbox, process: this.id, resize: { rows, cols } }));
  }

  /** Send a signal (a number or a name such as "TERM") to its process group. */
  async signal(sig: number | string): Promise<void> {
    const signal = signalNumber(sig);
    await call(`signal ${this.id}`, () => this.#c.rpc.processes.signalProcess({ sandbox: this.sandbox, process: this.id, signal }));
  }

  /** SIGKILL its process group; its exit status stays for wait(). */
  kill(): Promise<void> {
    return this.signal(9);
  }

  /** Wait for it to exit and return its exit code (see exitStatus). */
  async wait(opts: { timeout?: number } = {}): Promise<number> {
    const r = await call(`wait for ${this.id}`, () => this.#c.rpc.processes.waitProcess(
      { sandbox: this.sandbox, process: this.id }, { timeoutMs: opts.timeout ? Math.round(opts.timeout * 1000) : 0 }));
    this.update(r.process);
    if (!this.exitStatus) {
      throw toSbxError(`wait for ${this.id}`, new Error("the daemon's answer has no exit status"));
    }
    return this.exitStatus.exitCode;
  }

  /** Fetch its current state. */
  async refresh(): Promise<this> {
    const r = await call(`get process ${this.id}`, () => this.#c.rpc.processes.getProcess({ sandbox: this.sandbox, process: this.id }));
    this.update(r.process);
    return this;
  }

  /** Kill it (if it runs) and forget it. */
  async remove(): Promise<void> {
    await call(`remove process ${this.id}`, () => this.#c.rpc.processes.removeProcess({ sandbox: this.sandbox, process: this.id }));
  }
}

/** A sandbox's background processes (sandbox.processes). */
export class Processes {
  /** @internal */
  constructor(private readonly c: Client, private readonly sandbox: string) {}

  /** Start a background process (a shell line, or argv) and return at once. */
  async start(cmd: string | string[], opts: StartProcessOptions = {}): Promise<BackgroundProcess> {
    if (Array.isArray(cmd) ? cmd.length === 0 : !cmd.trim()) {
      throw new RangeError("start: the command is empty");
    }
    if (opts.timeout !== undefined && !(opts.timeout >= 0)) {
      throw new RangeError(`start: timeout ${opts.timeout}: want seconds, 0 or more`);
    }
    const stdin = opts.stdin;
    const exec = create(ExecRequestSchema, {
      sandbox: this.sandbox,
      argv: Array.isArray(cmd) ? cmd : [], shell: Array.isArray(cmd) ? "" : cmd,
      env: opts.env ?? {}, workdir: opts.cwd ?? "", user: opts.user ?? "",
      timeoutMs: BigInt(opts.timeout ? Math.max(1, Math.round(opts.timeout * 1000)) : 0),
      stdinOpen: stdin === true,
      stdin: typeof stdin === "string" ? new TextEncoder().encode(stdin) : stdin instanceof Uint8Array ? stdin : new Uint8Array(),
      tty: opts.pty ?? false,
      size: opts.pty ? { rows: opts.rows ?? 24, cols: opts.cols ?? 80 } : undefined,
    });
    const r = await call("start process", () => this.c.rpc.processes.startProcess({ exec, tag: opts.tag ?? "" }));
    return new BackgroundProcess(this.c, this.sandbox, r.process);
  }

  /** The sandbox's background processes, running and recently exited, oldest first. */
  async list(): Promise<BackgroundProcess[]> {
    const r = await call("list processes", () => this.c.rpc.processes.listProcesses({ sandbox: this.sandbox }));
    return r.processes.map((p) => new BackgroundProcess(this.c, this.sandbox, p));
  }

  /** Find a background process by pid, id or tag (from any client). */
  async connect(process: number | string): Promise<BackgroundProcess> {
    const r = await call(`get process ${process}`, () => this.c.rpc.processes.getProcess({ sandbox: this.sandbox, process: String(process) }));
    return new BackgroundProcess(this.c, this.sandbox, r.process);
  }
}
