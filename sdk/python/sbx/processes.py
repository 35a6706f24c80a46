"""Background processes: commands that outlive the call (and the client)
that started them, with input after the start, signals and a pseudo-terminal.

Start one with ``sb.exec(..., background=True)`` (or ``sb.processes.start``)
and find it again from any client with ``sb.processes.list()`` and
``sb.processes.connect(pid)``::

    p = sb.exec("python3", "-u", "server.py", background=True, stdin=True, tag="srv")
    p.send_stdin("hello\\n")
    for line in p.stdout:          # replays what it printed, then follows
        if "ready" in line:
            break
    p.kill()
    p.wait()                        # the exit code (137)

The sandbox's agent keeps the process, the newest output of each stream
and its exit status, so it survives its client and a daemon restart. A
foreground ``exec`` is killed when its client goes away instead.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

from ._transport import b64decode, b64encode
from .errors import SbxError, error_from_code
from .process import ExitStatus, OutputStream

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = ["BackgroundProcess", "Processes"]

SERVICE = "sbx.v1.ProcessService"

#: The most stdin one send_stdin call takes (the daemon's message bound).
MAX_STDIN = 4 << 20

_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "CONT": 18, "STOP": 19}


def _signal_number(sig: Union[int, str]) -> int:
    if isinstance(sig, str):
        name = sig.upper()
        if name.startswith("SIG"):
            name = name[3:]
        if name not in _SIGNALS:
            raise ValueError(f"unknown signal {sig!r}: use a number or one of {', '.join(_SIGNALS)}")
        return _SIGNALS[name]
    n = int(sig)
    if not 1 <= n <= 64:
        raise ValueError(f"signal {n}: want 1 to 64")
    return n


class BackgroundProcess:
    """A background process in a sandbox, as last seen.

    Attributes:
        id: its id (``"proc-..."``); ``pid``: its pid in the sandbox.
        tag: the label it was started with.
        command: its argv (``["/bin/sh", "-c", line]`` for a shell line).
        pty: whether it runs under a pseudo-terminal.
        stdin_open: whether :meth:`send_stdin` works.
        env, workdir: its start request's extra environment and working
            directory, as given.
        running: whether it still ran when last seen.
        exit_status: an :class:`~sbx.ExitStatus` once it has exited.
        dropped_stdout, dropped_stderr: bytes of output the sandbox no
            longer keeps (it keeps the newest of each stream).

    :attr:`stdout` and :attr:`stderr` replay the kept output and follow new
    output until the process exits (a reader thread starts on first use);
    iterate them for lines.
    """

    def __init__(self, sandbox: "Sandbox", info: Mapping[str, Any], *, encoding: str = "utf-8") -> None:
        self._sandbox = sandbox
        self._encoding = encoding
        self._lock = threading.Lock()
        self._follower: Optional[threading.Thread] = None
        self._stdout: Optional[OutputStream] = None
        self._stderr: Optional[OutputStream] = None
        self._follow_error: Optional[SbxError] = None
        self._update(info)

    def _update(self, info: Mapping[str, Any]) -> None:
        self.id: str = str(info.get("id") or "")
        self.pid: int = int(info.get("pid") or 0)
        self.tag: str = str(info.get("tag") or "")
        self.command: List[str] = list(info.get("command") or [])
        self.pty: bool = bool(info.get("tty"))
        self.stdin_open: bool = bool(info.get("stdinOpen"))
        self.started: float = int(info.get("startedMs") or 0) / 1000.0
        self.running: bool = bool(info.get("running"))
        ex = info.get("exited")
        self.exit_status: Optional[ExitStatus] = ExitStatus.from_json(ex) if ex is not None else None
        self.dropped_stdout: int = int(info.get("droppedStdoutBytes") or 0)
        self.dropped_stderr: int = int(info.get("droppedStderrBytes") or 0)
        self.env: Dict[str, str] = dict(info.get("env") or {})
        self.workdir: str = str(info.get("workdir") or "")

    def _call(self, method: str, req: Dict[str, Any], op: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        req = {"sandbox": self._sandbox.id, "process": self.id, **req}
        return self._sandbox._client._transport.unary(SERVICE, method, req, op=op, timeout=timeout)

    # -- output ----------------------------------------------------------------

    def _follow(self) -> None:
        with self._lock:
            if self._follower is not None:
                return
            self._stdout = OutputStream("stdout", self._encoding)
            self._stderr = OutputStream("stderr", self._encoding)
            stream = self._sandbox._client._transport.server_stream(
                SERVICE, "ConnectProcess", {"sandbox": self._sandbox.id, "process": self.id, "follow": True},
                op="connect process",
            )
            self._follower = threading.Thread(target=self._read, args=(stream,), name=f"sbx-proc-{self.pid}", daemon=True)
            self._follower.start()

    def _read(self, stream: Any) -> None:
        assert self._stdout is not None and self._stderr is not None
        try:
            for msg in stream:
                if "stdout" in msg:
                    self._stdout._feed(b64decode(msg["stdout"] or ""))
                elif "stderr" in msg:
                    self._stderr._feed(b64decode(msg["stderr"] or ""))
                elif "dropped" in msg:
                    d = msg["dropped"] or {}
                    self.dropped_stdout = max(self.dropped_stdout, int(d.get("stdoutBytes") or 0))
                    self.dropped_stderr = max(self.dropped_stderr, int(d.get("stderrBytes") or 0))
                elif "exited" in msg:
                    self.exit_status = ExitStatus.from_json(msg["exited"] or {})
                    self.running = False
                    break
        except SbxError as e:
            self._follow_error = e
        finally:
            stream.close()
            self._stdout._close()
            self._stderr._close()

    @property
    def stdout(self) -> OutputStream:
        """Its stdout from the oldest kept byte, then as it comes, until it exits."""
        self._follow()
        assert self._stdout is not None
        return self._stdout

    @property
    def stderr(self) -> OutputStream:
        """Its stderr, like :attr:`stdout` (empty under a pty)."""
        self._follow()
        assert self._stderr is not None
        return self._stderr

    def output(self, tail: Optional[int] = None) -> "tuple[str, str]":
        """What it has printed so far (what the sandbox kept): ``(stdout,
        stderr)``, or only their last ``tail`` lines. Does not wait."""
        req: Dict[str, Any] = {"sandbox": self._sandbox.id, "process": self.id}
        if tail is not None:
            req["tail"] = int(tail)
        stream = self._sandbox._client._transport.server_stream(SERVICE, "ConnectProcess", req, op="connect process")
        out: List[bytes] = []
        err: List[bytes] = []
        try:
            for msg in stream:
                if "stdout" in msg:
                    out.append(b64decode(msg["stdout"] or ""))
                elif "stderr" in msg:
                    err.append(b64decode(msg["stderr"] or ""))
                elif "exited" in msg:
                    self.exit_status = ExitStatus.from_json(msg["exited"] or {})
                    self.running = False
        finally:
            stream.close()
        return (b"".join(out).decode(self._encoding, "replace"), b"".join(err).decode(self._encoding, "replace"))

    # -- input and control -------------------------------------------------------

    def send_stdin(self, data: Union[bytes, str]) -> None:
        """Write to its stdin (started with ``stdin=True`` or ``pty=True``).

        Raises:
            FailedPreconditionError: its stdin is closed or it has exited.
            DeadlineExceededError: it did not read the data within seconds.
        """
        b = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        for i in range(0, len(b), MAX_STDIN):
            self._call("SendProcessInput", {"stdin": b64encode(b[i : i + MAX_STDIN])}, "send stdin")

    def close_stdin(self) -> None:
        """Give it end-of-file on stdin (``^D`` under a pty)."""
        self._call("SendProcessInput", {"stdinClose": True}, "close stdin")
        self.stdin_open = False

    def resize(self, rows: int, cols: int) -> None:
        """Resize its pseudo-terminal."""
        self._call("SendProcessInput", {"resize": {"rows": int(rows), "cols": int(cols)}}, "resize")

    def signal(self, sig: Union[int, str]) -> None:
        """Send a signal (a number or a name such as ``"TERM"``) to its process group."""
        self._call("SignalProcess", {"signal": _signal_number(sig)}, "signal process")

    def kill(self) -> None:
        """SIGKILL its process group. Its exit status stays for :meth:`wait`."""
        self.signal(9)

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for it to exit and return its exit code (see :attr:`exit_status`).

        Raises:
            DeadlineExceededError: it still runs after ``timeout`` seconds
                (it keeps running).
        """
        resp = self._call("WaitProcess", {}, "wait process", timeout=timeout)
        self._update(resp.get("process") or {})
        if self.exit_status is None:
            raise error_from_code("unknown", "the daemon's answer has no exit status", op="wait process")
        return self.exit_status.exit_code

    @property
    def returncode(self) -> Optional[int]:
        """The exit code if it had exited when last seen, else ``None``."""
        return self.exit_status.exit_code if self.exit_status is not None else None

    def refresh(self) -> "BackgroundProcess":
        """Fetch its current state."""
        self._update(self._call("GetProcess", {}, "get process").get("process") or {})
        return self

    def remove(self) -> None:
        """Kill it (if it runs) and forget it."""
        self._call("RemoveProcess", {}, "remove process")

    def __enter__(self) -> "BackgroundProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        """Kill and forget it when the block ends."""
        try:
            self.remove()
        except SbxError:
            pass

    def __repr__(self) -> str:
        state = "running" if self.running else f"exit {self.returncode}"
        return f"<sbx.BackgroundProcess {self.command!r} pid={self.pid} id={self.id} {state}>"


class Processes:
    """A sandbox's background processes (``sb.processes``)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def start(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        timeout: Any = None,
        stdin: Union[bool, bytes, str, None] = None,
        user: Optional[str] = None,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
        tag: str = "",
        encoding: str = "utf-8",
    ) -> BackgroundProcess:
        """Start a background process and return at once.

        Args:
            cmd: a shell command line (``str``) or an argv list.
            stdin: ``True`` keeps stdin open for :meth:`~BackgroundProcess.send_stdin`;
                bytes or str are written first (then stdin is closed, unless
                ``pty``); ``None``: no stdin.
            pty: run under a pseudo-terminal of ``rows`` × ``cols`` (stdin
                stays open; stdout carries the terminal's output).
            timeout: kill its process group after this many seconds (or a
                ``timedelta``).
            tag: a label to find it by (``processes.connect(tag)``).

        Raises:
            ResourceExhaustedError: the sandbox runs the most background
                processes allowed (``sbx serve --exec-max-background``).
            FailedPreconditionError: the command cannot start (not found...).
        """
        req: Dict[str, Any] = {"sandbox": self._sandbox.id}
        if isinstance(cmd, str):
            req["shell"] = cmd
        else:
            argv = [str(a) for a in cmd]
            if not argv:
                raise ValueError("start needs a command")
            req["argv"] = argv
        if env:
            req["env"] = dict(env)
        if workdir:
            req["workdir"] = workdir
        if timeout:
            secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
            if secs < 0:
                raise ValueError(f"timeout {timeout!r} must not be negative")
            req["timeoutMs"] = str(max(1, int(secs * 1000)))
        if user:
            req["user"] = user
        if stdin is True:
            req["stdinOpen"] = True
        elif stdin not in (None, False):
            assert not isinstance(stdin, bool)
            req["stdin"] = b64encode(stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin))
        if pty:
            req["tty"] = True
            req["size"] = {"rows": int(rows), "cols": int(cols)}
        body: Dict[str, Any] = {"exec": req}
        if tag:
            body["tag"] = tag
        resp = self._sandbox._client._transport.unary(SERVICE, "StartProcess", body, op="start process")
        return BackgroundProcess(self._sandbox, resp.get("process") or {}, encoding=encoding)

    def list(self) -> List[BackgroundProcess]:
        """The sandbox's background processes, running and recently exited, oldest first."""
        resp = self._sandbox._client._transport.unary(
            SERVICE, "ListProcesses", {"sandbox": self._sandbox.id}, op="list processes"
        )
        return [BackgroundProcess(self._sandbox, p) for p in resp.get("processes") or []]

    def connect(self, process: Union[int, str]) -> BackgroundProcess:
        """Find a background process by pid, id or tag (from any client)."""
        resp = self._sandbox._client._transport.unary(
            SERVICE, "GetProcess", {"sandbox": self._sandbox.id, "process": str(process)}, op="get process"
        )
        return BackgroundProcess(self._sandbox, resp.get("process") or {})

    get = connect
