import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";
import { concat, type OutputHandlers } from "./process.js";

/** A finished session command. */
export interface SessionResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  timedOut: boolean;
  error: string;
  durationMs: number;
  ok: boolean;
}

/** A long-lived shell in a sandbox: the working directory, exported
 * variables and shell functions persist between commands. */
export class Session {
  /** @internal */
  constructor(private readonly c: Client, readonly id: string, readonly sandbox: string, readonly shell: string) {}

  /** Run a command line in the session's shell. */
  async exec(command: string, opts: OutputHandlers & { timeout?: number } = {}): Promise<SessionResult> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    let res: SessionResult | undefined;
    const dec = new TextDecoder();
    try {
      for await (const m of this.c.rpc.sessions.sessionExec({
        session: this.id, command, timeoutMs: BigInt(Math.round((opts.timeout ?? 0) * 1000)),
      })) {
        const ev = m.event;
        if (ev.case === "stdout") {
          out.push(ev.value);
          opts.onStdout?.(ev.value);
        } else if (ev.case === "stderr") {
          err.push(ev.value);
          opts.onStderr?.(ev.value);
        } else if (ev.case === "result") {
          const r = ev.value;
          res = {
            stdout: "", stderr: "", exitCode: r.exitCode, timedOut: r.timedOut, error: r.error,
            durationMs: Number(r.durationMs), ok: r.exitCode === 0 && !r.timedOut && !r.error,
          };
        }
      }
    } catch (e) {
      throw toSbxError("session exec", e);
    }
    if (!res) {
      throw toSbxError("session exec", new Error("the stream ended before the command did"));
    }
    res.stdout = dec.decode(concat(out));
    res.stderr = dec.decode(concat(err));
    return res;
  }

  /** End the shell. */
  async close(): Promise<void> {
    await call("close session", () => this.c.rpc.sessions.closeSession({ session: this.id }));
  }
}
