import type { RunCodeEvent } from "./gen/sbx/v1/code_pb.js";
import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";
import { concat, type OutputHandlers } from "./process.js";

/** A file the program produced: a figure it showed, an image it displayed. */
export interface Artifact {
  name: string;
  /** "png", "svg", "jpeg", "json", ... */
  format: string;
  mime: string;
  content: Uint8Array;
}

/** A finished runCode. */
export interface CodeResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  /** Why the run failed (exception with traceback, compile error, timeout), if it did. */
  error: string;
  timedOut: boolean;
  durationMs: number;
  installed: string[];
  artifacts: Artifact[];
  /** The image artifacts again, as base64 with their format (llm-sandbox's shape). */
  plots: { name: string; format: string; contentBase64: string }[];
  /** The last expression's value (contexts only). */
  value?: { text: string; png?: Uint8Array; html: string };
  /** The context the code ran in ("" for a one-shot run). */
  context: string;
  /** exitCode is 0 and there is no error. */
  ok: boolean;
}

export interface RunCodeOptions extends OutputHandlers {
  /** "python" (default), "javascript", "bash", ... (contexts have their own). */
  language?: string;
  /** Packages to install first with the language's installer. */
  libraries?: string[];
  /** Seconds before the program is stopped. */
  timeout?: number;
  env?: Record<string, string>;
}

export async function runCode(c: Client, req: { sandbox?: string; language?: string; context?: string }, code: string, opts: RunCodeOptions): Promise<CodeResult> {
  const out: Uint8Array[] = [];
  const err: Uint8Array[] = [];
  let result: Extract<RunCodeEvent["event"], { case: "result" }>["value"] | undefined;
  try {
    for await (const m of c.rpc.code.runCode({
      ...req, code, libraries: opts.libraries ?? [], env: opts.env ?? {},
      timeoutMs: BigInt(Math.round((opts.timeout ?? 0) * 1000)),
    })) {
      const ev = m.event;
      if (ev.case === "stdout") {
        out.push(ev.value);
        opts.onStdout?.(ev.value);
      } else if (ev.case === "stderr") {
        err.push(ev.value);
        opts.onStderr?.(ev.value);
      } else if (ev.case === "result") {
        result = ev.value;
      }
    }
  } catch (e) {
    throw toSbxError("run code", e);
  }
  if (!result) {
    throw toSbxError("run code", new Error("the stream ended before the code did"));
  }
  const dec = new TextDecoder();
  const artifacts = result.artifacts.map((a) => ({ name: a.name, format: a.format, mime: a.mime, content: a.content }));
  return {
    stdout: dec.decode(concat(out)), stderr: dec.decode(concat(err)),
    exitCode: result.exitCode, error: result.error, timedOut: result.timedOut, durationMs: Number(result.durationMs),
    installed: result.installed, artifacts, context: result.context,
    plots: artifacts.filter((a) => a.mime.startsWith("image/") && a.content.length > 0)
      .map((a) => ({ name: a.name, format: a.format, contentBase64: Buffer.from(a.content).toString("base64") })),
    value: result.value ? { text: result.value.text, html: result.value.html, png: result.value.png.length ? result.value.png : undefined } : undefined,
    ok: result.exitCode === 0 && !result.error && !result.timedOut,
  };
}

/** A stateful interpreter in a sandbox: variables, imports and the working
 * directory survive between runs. */
export class CodeContext {
  /** @internal */
  constructor(private readonly c: Client, readonly id: string, readonly sandbox: string, readonly language: string) {}

  /** Run code in this context. */
  run(code: string, opts: Omit<RunCodeOptions, "language"> = {}): Promise<CodeResult> {
    return runCode(this.c, { context: this.id }, code, opts);
  }

  /** Stop the interpreter. */
  async close(): Promise<void> {
    await call("close context", () => this.c.rpc.code.closeContext({ context: this.id }));
  }
}
