"""Stateful shell sessions: the working directory, exported variables,
activated virtualenvs and background jobs survive between commands.

Use it through :meth:`sbx.Sandbox.session`::

    with sb.session(env={"A": "1"}) as sh:
        sh.exec("cd /tmp && export B=2")
        r = sh.exec("pwd; echo $A$B")      # r.stdout == "/tmp\\n12\\n"
        r = sh.exec("sleep 100", timeout=1) # interrupted; r.timed_out
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional

from ._transport import b64decode

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Session", "SessionResult"]

SERVICE = "sbx.v1.SessionService"


@dataclass
class SessionResult:
    """A finished command. A failing command is not an exception."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    #: The command hit its timeout and was interrupted (SIGINT).
    timed_out: bool = False
    duration_ms: int = 0
    #: Set when the session ended during the command (it is gone).
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error and not self.timed_out


class Session:
    """A shell in a sandbox that keeps its state between :meth:`exec` calls.
    Closed (with everything it started) when used as a context manager."""

    def __init__(self, client: "Client", info: Mapping[str, Any]) -> None:
        self._client = client
        self.id: str = info.get("id", "")
        self.sandbox: str = info.get("sandbox", "")
        self.shell: str = info.get("shell", "")

    def exec(
        self,
        command: str,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> SessionResult:
        """Run a command line in the session's shell and return its own
        output and exit code. After ``timeout`` seconds the command is
        interrupted (SIGINT); the session survives."""
        req: Dict[str, Any] = {"session": self.id, "command": command}
        if timeout:
            req["timeoutMs"] = max(1, int(timeout * 1000))
        out: List[str] = []
        err: List[str] = []
        res = SessionResult()
        with self._client._transport.server_stream(SERVICE, "SessionExec", req, op="session exec") as stream:
            for msg in stream:
                if "stdout" in msg:
                    text = b64decode(msg["stdout"]).decode("utf-8", "replace")
                    out.append(text)
                    if on_stdout:
                        on_stdout(text)
                elif "stderr" in msg:
                    text = b64decode(msg["stderr"]).decode("utf-8", "replace")
                    err.append(text)
                    if on_stderr:
                        on_stderr(text)
                elif "result" in msg:
                    r = msg["result"]
                    res.exit_code = int(r.get("exitCode", 0))
                    res.timed_out = bool(r.get("timedOut", False))
                    res.duration_ms = int(r.get("durationMs", 0))
                    res.error = r.get("error", "")
        res.stdout, res.stderr = "".join(out), "".join(err)
        return res

    def close(self) -> None:
        """Kill the shell and everything it started (background jobs too)."""
        self._client._transport.unary(SERVICE, "CloseSession", {"session": self.id}, op=f"close session {self.id}")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<sbx.Session {self.id} {self.shell} in {self.sandbox}>"


def list_sessions(client: "Client", sandbox: str = "") -> List[Session]:
    resp = client._transport.unary(SERVICE, "ListSessions", {"sandbox": sandbox}, op="list sessions")
    return [Session(client, s) for s in resp.get("sessions", [])]
