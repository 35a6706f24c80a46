"""The sandbox's own command: :class:`SandboxLogs` (its output) and :class:`LogChunk`."""

from __future__ import annotations

import codecs
import datetime as _dt
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Union

from ._transport import ServerStream, b64decode
from .process import ExitStatus

__all__ = ["LogChunk", "SandboxLogs", "LogLines", "logs_request"]

SERVICE = "sbx.v1.SandboxService"


@dataclass(frozen=True)
class LogChunk:
    """A piece of the command's output.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: the bytes.
        time: when the sandbox read its first byte (seconds since the epoch).
    """

    stream: str
    data: bytes
    time: float

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def logs_request(
    sandbox_id: str, follow: bool, since: Union[float, _dt.datetime, _dt.timedelta, None], tail: Optional[int]
) -> Dict[str, Any]:
    req: Dict[str, Any] = {"sandbox": sandbox_id}
    if follow:
        req["follow"] = True
    if since is not None:
        if isinstance(since, _dt.timedelta):
            since = _dt.datetime.now(_dt.timezone.utc) - since
        if isinstance(since, _dt.datetime):
            since = since.timestamp()
        req["sinceUnixMs"] = str(int(float(since) * 1000))
    if tail is not None:
        if tail < 0:
            raise ValueError("tail must not be negative")
        req["tail"] = int(tail)
    return req


class SandboxLogs(Iterator[LogChunk]):
    """The output of a sandbox's own command, as :class:`LogChunk` pieces in
    the order the sandbox read them (see :meth:`Sandbox.logs`).

    After the iteration, :attr:`exit` is how the command ended (``None`` if
    it still runs) and :attr:`dropped_stdout` / :attr:`dropped_stderr` count
    the bytes the sandbox dropped before they were read (it keeps the newest
    1 MiB of each stream). :meth:`close` (from any thread) stops reading;
    the command is not affected.
    """

    def __init__(self, stream: ServerStream) -> None:
        self._stream = stream
        self.exit: Optional[ExitStatus] = None
        self.dropped_stdout = 0
        self.dropped_stderr = 0

    def __iter__(self) -> "SandboxLogs":
        return self

    def __next__(self) -> LogChunk:
        for msg in self._stream:
            if "data" in msg:
                d = msg["data"] or {}
                return LogChunk(
                    stream="stderr" if d.get("stderr") else "stdout",
                    data=b64decode(d.get("data") or ""),
                    time=int(d.get("timeUnixMs") or 0) / 1000.0,
                )
            if "dropped" in msg:
                d = msg["dropped"] or {}
                self.dropped_stdout += int(d.get("stdoutBytes") or 0)
                self.dropped_stderr += int(d.get("stderrBytes") or 0)
            elif "exited" in msg:
                self.exit = ExitStatus.from_json(msg["exited"] or {})
        raise StopIteration

    def read(self) -> Dict[str, bytes]:
        """Read to the end; return ``{"stdout": ..., "stderr": ...}``."""
        out = {"stdout": b"", "stderr": b""}
        parts: Dict[str, list] = {"stdout": [], "stderr": []}
        for c in self:
            parts[c.stream].append(c.data)
        for k, v in parts.items():
            out[k] = b"".join(v)
        return out

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "SandboxLogs":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LogLines(Iterator[str]):
    """The lines (with their newline) of one stream of the command, followed
    until it exits: ``for line in sb.stdout: ...``. :meth:`read` returns
    the rest at once."""

    def __init__(self, logs: SandboxLogs, stream: str, encoding: str = "utf-8") -> None:
        self._logs = logs
        self._stream = stream
        self._dec = codecs.getincrementaldecoder(encoding)("replace")
        self._buf = ""
        self._eof = False

    def __iter__(self) -> "LogLines":
        return self

    def __next__(self) -> str:
        while True:
            i = self._buf.find("\n")
            if i >= 0:
                line, self._buf = self._buf[: i + 1], self._buf[i + 1 :]
                return line
            if self._eof:
                if self._buf:
                    line, self._buf = self._buf, ""
                    return line
                raise StopIteration
            try:
                c = next(self._logs)
            except StopIteration:
                self._eof = True
                self._buf += self._dec.decode(b"", final=True)
                continue
            if c.stream == self._stream:
                self._buf += self._dec.decode(c.data)

    def read(self) -> str:
        return "".join(self)

    @property
    def exit(self) -> Optional[ExitStatus]:
        """How the command ended, once the lines are all read."""
        return self._logs.exit

    def close(self) -> None:
        self._logs.close()
