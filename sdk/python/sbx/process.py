"""Running commands: :class:`Process` (streamed output) and :class:`CommandResult`."""

from __future__ import annotations

import codecs
import queue
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional

from ._transport import ServerStream, b64decode
from .errors import SbxError, error_from_code

__all__ = ["ExitStatus", "CommandResult", "OutputStream", "Process"]

_EOF = object()


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended.

    Attributes:
        exit_code: the exit code; ``128 + signal`` when killed by a signal.
        signal: the signal that killed it (0: none).
        timed_out: whether the command's ``timeout`` killed it.
        error: set when the command could not be started (exit code 126/127).
        duration: how long it ran, in seconds.
        oom_killed: whether the sandbox's memory limit killed it: it died by
            SIGKILL (or a shell reported exit code 137) while the sandbox's
            count of OOM kills rose (a heuristic: the kernel counts per
            sandbox, not per process).
        pids_limit_hit: whether the command failed and the sandbox's pids
            limit refused a fork (of any of its processes) while it ran.
    """

    exit_code: int
    signal: int = 0
    timed_out: bool = False
    error: str = ""
    duration: float = 0.0
    oom_killed: bool = False
    pids_limit_hit: bool = False

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "ExitStatus":
        return cls(
            exit_code=int(obj.get("exitCode") or 0),
            signal=int(obj.get("signal") or 0),
            timed_out=bool(obj.get("timedOut")),
            error=str(obj.get("error") or ""),
            duration=int(obj.get("durationMs") or 0) / 1000.0,
            oom_killed=bool(obj.get("oomKilled")),
            pids_limit_hit=bool(obj.get("pidsLimitHit")),
        )


@dataclass(frozen=True)
class CommandResult:
    """A finished command with its collected output (see :meth:`Sandbox.run`)."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    signal: int = 0
    #: Set when the command could not be started.
    error: str = ""
    #: Seconds the command ran.
    duration: float = 0.0
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    #: The sandbox's memory limit killed it (SIGKILL).
    oom_killed: bool = False
    #: The sandbox's pids limit refused a fork while it ran.
    pids_limit_hit: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 without timing out."""
        return self.exit_code == 0 and not self.timed_out and not self.error

    def __bool__(self) -> bool:  # pragma: no cover - convenience
        return self.ok


class OutputStream:
    """One output stream (stdout or stderr) of a running :class:`Process`.

    Data is queued by the process's reader thread as it arrives. Iterate it
    for lines (``str``, with their trailing newline) as they are printed, or
    call :meth:`read` for everything until the stream ends. stdout and stderr
    have their own queues, so each can be consumed independently (even from
    different threads); one stream must only be consumed by one thread.
    """

    def __init__(self, name: str, encoding: str = "utf-8", errors: str = "replace") -> None:
        self.name = name
        self._q: "queue.Queue[object]" = queue.Queue()
        self._buf = b""
        self._eof = False
        self._encoding = encoding
        self._errors = errors

    # Fed by the reader thread.
    def _feed(self, data: bytes) -> None:
        if data:
            self._q.put(data)

    def _close(self) -> None:
        self._q.put(_EOF)

    def _next_chunk(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """Next chunk of bytes, or None at EOF. Raises queue.Empty on timeout."""
        if self._eof:
            return None
        item = self._q.get(timeout=timeout)
        if item is _EOF:
            self._eof = True
            return None
        assert isinstance(item, bytes)
        return item

    def iter_bytes(self) -> Iterator[bytes]:
        """Yield raw chunks of output as they arrive."""
        if self._buf:
            b, self._buf = self._buf, b""
            yield b
        while True:
            chunk = self._next_chunk()
            if chunk is None:
                return
            yield chunk

    def readline_bytes(self) -> bytes:
        """The next line as bytes (with its newline); ``b""`` at the end."""
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[: i + 1], self._buf[i + 1 :]
                return line
            chunk = self._next_chunk()
            if chunk is None:
                line, self._buf = self._buf, b""
                return line
            self._buf += chunk

    def readline(self) -> str:
        """The next line (with its newline); ``""`` at the end of the stream."""
        return self.readline_bytes().decode(self._encoding, self._errors)

    def __iter__(self) -> Iterator[str]:
        while True:
            line = self.readline_bytes()
            if not line:
                return
            yield line.decode(self._encoding, self._errors)

    def read_bytes(self) -> bytes:
        """Everything until the stream ends, as bytes."""
        parts: List[bytes] = [self._buf]
        self._buf = b""
        while True:
            chunk = self._next_chunk()
            if chunk is None:
                return b"".join(parts)
            parts.append(chunk)

    def read(self) -> str:
        """Everything until the stream ends, decoded."""
        return self.read_bytes().decode(self._encoding, self._errors)

    def iter_text(self) -> Iterator[str]:
        """Yield decoded text as it arrives (not split into lines)."""
        dec = codecs.getincrementaldecoder(self._encoding)(self._errors)
        for chunk in self.iter_bytes():
            text = dec.decode(chunk)
            if text:
                yield text
        tail = dec.decode(b"", final=True)
        if tail:
            yield tail


class Process:
    """A command running in a sandbox, started with :meth:`Sandbox.exec`.

    A background thread reads the daemon's output stream and feeds
    :attr:`stdout` and :attr:`stderr`; iterate them for lines as they are
    printed. :meth:`wait` blocks until the command exits and returns its exit
    code. Use it as a context manager to kill the command if the block exits
    early.

    Stdin can only be given up front (``exec(..., stdin=b"...")``):
    interactive stdin needs the bidirectional ``ExecInteractive`` call, which
    requires HTTP/2 and is available from the Go SDK and the CLI.
    """

    def __init__(self, stream: ServerStream, argv: List[str], *, encoding: str = "utf-8") -> None:
        self.args = argv
        self.stdout = OutputStream("stdout", encoding)
        self.stderr = OutputStream("stderr", encoding)
        self.pid: int = 0
        self.exit_status: Optional[ExitStatus] = None
        self._stream = stream
        self._error: Optional[SbxError] = None
        self._done = threading.Event()
        self._killed = False
        # Read up to `started` synchronously so that errors such as an unknown
        # sandbox are raised by exec() itself.
        first: Optional[Dict[str, Any]] = None
        got = False
        try:
            for msg in stream:
                got = True
                if "started" in msg:
                    self.pid = int((msg["started"] or {}).get("pid") or 0)
                else:
                    first = msg
                break
        except BaseException:
            stream.close()
            raise
        if not got:
            # The stream ended cleanly before anything happened.
            stream.close()
            raise error_from_code("internal", "exec ended before the command started", op="exec")
        if first is not None:
            self._handle(first)
        self._thread = threading.Thread(target=self._read, name=f"sbx-exec-{argv[:1]}", daemon=True)
        self._thread.start()

    def _handle(self, msg: Dict[str, Any]) -> bool:
        if "stdout" in msg:
            self.stdout._feed(b64decode(msg["stdout"] or ""))
        elif "stderr" in msg:
            self.stderr._feed(b64decode(msg["stderr"] or ""))
        elif "exited" in msg:
            self.exit_status = ExitStatus.from_json(msg["exited"] or {})
            return True
        return False

    def _read(self) -> None:
        try:
            if self.exit_status is None:
                for msg in self._stream:
                    if self._handle(msg):
                        break
                if self.exit_status is None and self._error is None:
                    self._error = error_from_code(
                        "unavailable", "output stream ended before the command exited", op="exec"
                    )
        except SbxError as e:
            self._error = e
        except Exception as e:  # pragma: no cover - defensive
            self._error = error_from_code("unknown", str(e), op="exec")
        finally:
            self._stream.close()
            self.stdout._close()
            self.stderr._close()
            self._done.set()

    @property
    def returncode(self) -> Optional[int]:
        """The exit code, or ``None`` while the command runs."""
        return self.exit_status.exit_code if self.exit_status is not None else None

    @property
    def timed_out(self) -> bool:
        """Whether the command was killed by its timeout."""
        return bool(self.exit_status and self.exit_status.timed_out)

    def poll(self) -> Optional[int]:
        """The exit code if the command has exited, else ``None``."""
        if self._done.is_set():
            self._raise_error()
        return self.returncode

    def _raise_error(self) -> None:
        if self._error is not None and self.exit_status is None:
            if self._killed:
                raise error_from_code("canceled", "the command was killed by the client", op="exec")
            raise self._error

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the command to exit and return its exit code.

        Output not consumed from :attr:`stdout`/:attr:`stderr` stays buffered.

        Raises:
            TimeoutError: the command still runs after ``timeout`` seconds
                (it keeps running; use :meth:`kill` to stop it).
            SbxError: the stream broke before the command exited.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"command still running after {timeout}s")
        self._thread.join()
        self._raise_error()
        assert self.exit_status is not None
        return self.exit_status.exit_code

    def kill(self) -> None:
        """Kill the command by abandoning the call: the daemon kills the whole
        process group when the client goes away."""
        if self._done.is_set():
            return
        self._killed = True
        self._stream.close()

    def result(self) -> CommandResult:
        """Wait for the command and collect the output not consumed yet."""
        out = self.stdout.read_bytes()
        err = self.stderr.read_bytes()
        self.wait()
        st = self.exit_status
        assert st is not None
        return CommandResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=st.exit_code,
            timed_out=st.timed_out,
            signal=st.signal,
            error=st.error,
            duration=st.duration,
            oom_killed=st.oom_killed,
            pids_limit_hit=st.pids_limit_hit,
            stdout_bytes=out,
            stderr_bytes=err,
        )

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done.is_set():
            self.kill()
            self._done.wait(5)

    def __repr__(self) -> str:
        state = "running" if self.exit_status is None else f"exit {self.exit_status.exit_code}"
        return f"<sbx.Process {self.args!r} pid={self.pid} {state}>"

