import { EventType, type Event as PbEvent, type StatsSample, type SandboxStatsEntry } from "./gen/sbx/v1/observe_pb.js";
import type { Client } from "./client.js";
import { call, toSbxError } from "./errors.js";

/** The short names of event types, for events({ types }). */
export const EVENT_TYPES = [
  "created", "started", "stopped", "destroyed", "failed", "exec_started", "exec_ended", "oom", "pids_limit",
  "image_pulled", "image_built", "daemon_started",
] as const;
export type EventTypeName = (typeof EVENT_TYPES)[number];

function typeName(t: EventType): string {
  return (EventType[t] ?? "unspecified").toLowerCase();
}

function typeOf(name: string): EventType {
  const t = (EventType as unknown as Record<string, number>)[name.toUpperCase()];
  if (t === undefined || t === EventType.UNSPECIFIED) {
    throw new RangeError(`unknown event type ${JSON.stringify(name)}: want one of ${EVENT_TYPES.join(", ")}`);
  }
  return t;
}

/** One of the daemon's events. */
export interface SbxEvent {
  /** The daemon's number for it (resume with afterSeq). */
  seq: number;
  time: Date;
  type: string;
  sandboxId: string;
  sandboxName: string;
  labels: Record<string, string>;
  /** A short word (destroyed: user, timeout, idle, parent, failed; ...). */
  reason: string;
  detail: string;
  exitCode: number;
  signal: number;
  count: number;
}

function eventOf(e: PbEvent): SbxEvent {
  return {
    seq: Number(e.seq), time: new Date(Number(e.timeMs)), type: typeName(e.type), sandboxId: e.sandboxId,
    sandboxName: e.sandboxName, labels: e.labels, reason: e.reason, detail: e.detail, exitCode: e.exitCode,
    signal: e.signal, count: Number(e.count),
  };
}

/** Options of client.events. */
export interface EventsOptions {
  /** Short names from EVENT_TYPES (default all). */
  types?: string[];
  /** Sandbox ids or names. */
  sandboxes?: string[];
  /** Label selectors ("app=web"). */
  labels?: string[];
  /** Replay the held events from this time (the daemon keeps the newest 4096). */
  since?: Date;
  /** Replay the held events after this seq. */
  afterSeq?: number;
  /** Keep following new events (default true); false stops after the replay. */
  follow?: boolean;
  /** Called once the replay is done and live events follow. */
  onLive?: () => void;
  signal?: AbortSignal;
}

/** The daemon's events the token may see, in order, as an async iterator
 * (a bad type throws here, before any call). */
export function events(c: Client, opts: EventsOptions = {}): AsyncGenerator<SbxEvent> {
  if (opts.afterSeq !== undefined && !(Number.isInteger(opts.afterSeq) && opts.afterSeq >= 0)) {
    throw new RangeError(`events: afterSeq ${opts.afterSeq}: want a whole number, 0 or more`);
  }
  if (opts.since !== undefined && Number.isNaN(opts.since.getTime())) {
    throw new RangeError("events: since is an invalid Date");
  }
  return follow(c, opts, (opts.types ?? []).map(typeOf));
}

async function* follow(c: Client, opts: EventsOptions, types: EventType[]): AsyncGenerator<SbxEvent> {
  try {
    for await (const m of c.rpc.observe.events({
      types, sandboxes: opts.sandboxes ?? [], labelSelectors: opts.labels ?? [],
      // The daemon replays nothing for 0: since the epoch is "everything held".
      sinceMs: BigInt(opts.since ? Math.max(1, opts.since.getTime()) : 0), afterSeq: BigInt(opts.afterSeq ?? 0), noFollow: opts.follow === false,
    }, { timeoutMs: 0, signal: opts.signal })) {
      if (m.kind.case === "event") {
        yield eventOf(m.kind.value);
      } else if (m.kind.case === "live") {
        opts.onLive?.();
      }
    }
  } catch (e) {
    if (opts.signal?.aborted) {
      return;
    }
    throw toSbxError("events", e);
  }
}

/** One sample of a sandbox's usage. */
export interface UsageSample {
  time: Date;
  cpuUsageNs: number;
  cpuMillis: number;
  memoryBytes: number;
  pids: number;
  diskUsedBytes: number;
  netRxBytes: number;
  netTxBytes: number;
}

/** A sandbox's usage and limits (client.stats). */
export interface SandboxUsage {
  sandboxId: string;
  sandboxName: string;
  state: string;
  current?: UsageSample;
  memoryLimitBytes: number;
  diskLimitBytes: number;
  pidsLimit: number;
  cpuLimitMillis: number;
  oomKills: number;
  pidsLimitHits: number;
  execs: number;
  memoryPeakBytes: number;
  history: UsageSample[];
}

function sampleOf(s: StatsSample): UsageSample {
  return {
    time: new Date(Number(s.timeMs)), cpuUsageNs: Number(s.cpuUsageNs), cpuMillis: Number(s.cpuMillis),
    memoryBytes: Number(s.memoryBytes), pids: Number(s.pids), diskUsedBytes: Number(s.diskUsedBytes),
    netRxBytes: Number(s.netRxBytes), netTxBytes: Number(s.netTxBytes),
  };
}

function usageOf(e: SandboxStatsEntry): SandboxUsage {
  return {
    sandboxId: e.sandboxId, sandboxName: e.sandboxName, state: e.state, current: e.current ? sampleOf(e.current) : undefined,
    memoryLimitBytes: Number(e.memoryLimitBytes), diskLimitBytes: Number(e.diskLimitBytes), pidsLimit: Number(e.pidsLimit),
    cpuLimitMillis: Number(e.cpuLimitMillis), oomKills: Number(e.oomKills), pidsLimitHits: Number(e.pidsLimitHits),
    execs: Number(e.execs), memoryPeakBytes: Number(e.memoryPeakBytes), history: e.history.map(sampleOf),
  };
}

/** Usage of the sandboxes named (every one the token may see when none). */
export async function stats(c: Client, sandboxes: string[], history: boolean): Promise<SandboxUsage[]> {
  const r = await call("stats", () => c.rpc.observe.stats({ sandboxes, history }));
  return r.sandboxes.map(usageOf);
}
