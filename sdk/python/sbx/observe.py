"""Observing: :meth:`Client.events` (what happens to sandboxes, images and the
daemon, as it happens) and :meth:`Client.stats` (sandboxes' current usage with
a short history), both limited to what the client's token may see."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Union

from ._transport import ServerStream, Transport
from .types import _int

__all__ = ["Event", "EventStream", "SandboxUsage", "UsageSample", "EVENT_TYPES"]

_SERVICE = "sbx.v1.ObserveService"

#: The event types, by their short names.
EVENT_TYPES = (
    "created", "started", "stopped", "destroyed", "failed", "exec_started", "exec_ended",
    "oom", "pids_limit", "image_pulled", "image_built", "daemon_started",
)


def _short(enum: str) -> str:
    return enum[len("EVENT_TYPE_"):].lower() if enum.startswith("EVENT_TYPE_") else enum.lower()


@dataclass(frozen=True)
class Event:
    """One event.

    Attributes:
        seq: the daemon's number for it, from 1 since it started (resume a
            dropped stream with ``after_seq``).
        time: seconds since the epoch.
        type: a short name from :data:`EVENT_TYPES` (``"oom"``).
        sandbox_id, sandbox_name, labels: the sandbox's (empty for image and
            daemon events).
        reason: a short word: destroyed: user, timeout, idle, parent, failed;
            failed: create, oom, crashed; exec_ended: oom, timeout, aborted.
        detail: for humans (a state detail, a command's argv[0], an image).
        exit_code, signal: an exec_ended's.
        count: how many kills (oom) or refused forks (pids_limit).
    """

    seq: int
    time: float
    type: str
    sandbox_id: str = ""
    sandbox_name: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    reason: str = ""
    detail: str = ""
    exit_code: int = 0
    signal: int = 0
    count: int = 0

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Event":
        return cls(
            seq=_int(obj, "seq"), time=_int(obj, "timeMs") / 1000.0, type=_short(str(obj.get("type", ""))),
            sandbox_id=str(obj.get("sandboxId", "")), sandbox_name=str(obj.get("sandboxName", "")),
            labels=dict(obj.get("labels") or {}), reason=str(obj.get("reason", "")), detail=str(obj.get("detail", "")),
            exit_code=_int(obj, "exitCode"), signal=_int(obj, "signal"), count=_int(obj, "count"),
        )


class EventStream(Iterator[Event]):
    """The events of :meth:`Client.events`, in order. :attr:`live` turns true
    once the replay is over; :meth:`close` (from any thread) ends the stream.
    A stream that fell behind ends with :class:`~sbx.ResourceExhaustedError`:
    resume with ``after_seq`` set to the last event's :attr:`Event.seq`."""

    def __init__(self, stream: ServerStream) -> None:
        self._stream = stream
        self.live = False

    def __iter__(self) -> "EventStream":
        return self

    def __next__(self) -> Event:
        for msg in self._stream:
            if "event" in msg:
                return Event.from_json(msg["event"] or {})
            if msg.get("live"):
                self.live = True
        raise StopIteration

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def events_request(
    types: Optional[Iterable[str]], sandboxes: Optional[Iterable[str]], labels: Optional[Iterable[str]],
    since: Union[float, _dt.datetime, _dt.timedelta, None], after_seq: int, follow: bool,
) -> Dict[str, Any]:
    req: Dict[str, Any] = {}
    if types:
        bad = [t for t in types if t not in EVENT_TYPES]
        if bad:
            raise ValueError(f"unknown event types {bad}: want some of {', '.join(EVENT_TYPES)}")
        req["types"] = ["EVENT_TYPE_" + t.upper() for t in types]
    if sandboxes:
        req["sandboxes"] = list(sandboxes)
    if labels:
        req["labelSelectors"] = list(labels)
    if since is not None:
        if isinstance(since, _dt.timedelta):
            since = _dt.datetime.now(_dt.timezone.utc) - since
        if isinstance(since, _dt.datetime):
            since = since.timestamp()
        req["sinceMs"] = str(int(float(since) * 1000))
    if after_seq:
        req["afterSeq"] = str(int(after_seq))
    if not follow:
        if since is None and not after_seq:
            raise ValueError("follow=False needs since or after_seq: without them there is nothing to replay")
        req["noFollow"] = True
    return req


@dataclass(frozen=True)
class UsageSample:
    """One sample of a sandbox's usage (bytes; CPU as used time and as a
    rate in thousandths of a core over the previous sample)."""

    time: float
    cpu_usage_ns: int = 0
    cpu_millis: int = 0
    memory: int = 0
    pids: int = 0
    disk_used: int = 0
    net_rx: int = 0
    net_tx: int = 0

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "UsageSample":
        return cls(
            time=_int(obj, "timeMs") / 1000.0, cpu_usage_ns=_int(obj, "cpuUsageNs"), cpu_millis=_int(obj, "cpuMillis"),
            memory=_int(obj, "memoryBytes"), pids=_int(obj, "pids"), disk_used=_int(obj, "diskUsedBytes"),
            net_rx=_int(obj, "netRxBytes"), net_tx=_int(obj, "netTxBytes"),
        )


@dataclass(frozen=True)
class SandboxUsage:
    """A sandbox's usage from :meth:`Client.stats`: the latest sample
    (``None`` before the first), its limits (0: none), totals, and with
    ``history=True`` the samples of the last 15 minutes, oldest first."""

    sandbox_id: str
    sandbox_name: str = ""
    state: str = ""
    current: Optional[UsageSample] = None
    memory_limit: int = 0
    disk_limit: int = 0
    pids_limit: int = 0
    cpu_limit_millis: int = 0
    oom_kills: int = 0
    pids_limit_hits: int = 0
    execs: int = 0
    memory_peak: int = 0
    history: List[UsageSample] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "SandboxUsage":
        cur = obj.get("current")
        return cls(
            sandbox_id=str(obj.get("sandboxId", "")), sandbox_name=str(obj.get("sandboxName", "")),
            state=str(obj.get("state", "")), current=UsageSample.from_json(cur) if cur else None,
            memory_limit=_int(obj, "memoryLimitBytes"), disk_limit=_int(obj, "diskLimitBytes"),
            pids_limit=_int(obj, "pidsLimit"), cpu_limit_millis=_int(obj, "cpuLimitMillis"),
            oom_kills=_int(obj, "oomKills"), pids_limit_hits=_int(obj, "pidsLimitHits"), execs=_int(obj, "execs"),
            memory_peak=_int(obj, "memoryPeakBytes"),
            history=[UsageSample.from_json(s) for s in obj.get("history") or []],
        )


def events(
    t: Transport, types: Optional[Iterable[str]] = None, sandboxes: Optional[Iterable[str]] = None,
    labels: Optional[Iterable[str]] = None, since: Union[float, _dt.datetime, _dt.timedelta, None] = None,
    after_seq: int = 0, follow: bool = True,
) -> EventStream:
    req = events_request(types, sandboxes, labels, since, after_seq, follow)
    return EventStream(t.server_stream(_SERVICE, "Events", req, op="events"))


def stats(t: Transport, sandboxes: Iterable[str], history: bool) -> List[SandboxUsage]:
    req: Dict[str, Any] = {"sandboxes": list(sandboxes)}
    if history:
        req["history"] = True
    resp = t.unary(_SERVICE, "Stats", req, op="stats")
    return [SandboxUsage.from_json(s) for s in resp.get("sandboxes") or []]
