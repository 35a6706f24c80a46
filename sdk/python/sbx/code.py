"""Running code: one-shot runs, stateful contexts, artifacts and code policy.

Use it through :meth:`sbx.Sandbox.run_code` and
:meth:`sbx.Sandbox.create_context`::

    res = sb.run_code("python", "import matplotlib.pyplot as plt; plt.plot([1, 2])")
    for a in res.artifacts:
        a.save("out")          # out/figure-1.png

    ctx = sb.create_context("python")
    ctx.run("x = 41")
    print(ctx.run("x + 1").text)   # 42
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence

from ._transport import b64decode

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Artifact", "CodeContext", "CodeResult", "PolicyFinding"]

SERVICE = "sbx.v1.CodeService"

_SEVERITIES = {"low": "SEVERITY_LOW", "medium": "SEVERITY_MEDIUM", "high": "SEVERITY_HIGH", "critical": "SEVERITY_CRITICAL"}


@dataclass
class Artifact:
    """A plot or file the code produced (under ``$SBX_OUTPUT_DIR``)."""

    name: str
    format: str
    mime: str
    size: int
    content: bytes

    def save(self, directory: str) -> str:
        """Write the artifact under ``directory`` and return its path."""
        path = os.path.normpath(os.path.join(directory, self.name))
        if not path.startswith(os.path.normpath(directory) + os.sep):
            raise ValueError(f"artifact name {self.name!r} escapes {directory!r}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(self.content)
        return path


@dataclass
class PolicyFinding:
    rule: str
    severity: str
    line: int
    column: int
    match: str
    message: str


@dataclass
class CodeResult:
    """A finished run. A failing program is not an exception: see ``error``."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    #: Why the run failed (exception, compile error, timeout), or "".
    error: str = ""
    timed_out: bool = False
    duration_ms: int = 0
    installed: List[str] = field(default_factory=list)
    artifacts: List[Artifact] = field(default_factory=list)
    #: The last expression's value (contexts): text, png bytes, html.
    text: Optional[str] = None
    png: Optional[bytes] = None
    html: Optional[str] = None
    findings: List[PolicyFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error


def policy_request(
    policy: Optional[Sequence[str]], enforce: bool, threshold: Optional[str], rules: Optional[Sequence[Mapping[str, Any]]]
) -> Optional[Dict[str, Any]]:
    if not policy and not rules:
        return None
    req: Dict[str, Any] = {"presets": list(policy or []), "mode": "POLICY_MODE_ENFORCE" if enforce else "POLICY_MODE_ADVISORY"}
    if rules:
        req["rules"] = [dict(r) for r in rules]
    if threshold:
        if threshold.lower() not in _SEVERITIES:
            raise ValueError(f"threshold must be one of {', '.join(_SEVERITIES)}")
        req["threshold"] = _SEVERITIES[threshold.lower()]
    return req


def run(
    client: "Client",
    req: Dict[str, Any],
    on_stdout: Optional[Callable[[str], None]],
    on_stderr: Optional[Callable[[str], None]],
) -> CodeResult:
    """Make a RunCode call and collect its events."""
    out: List[str] = []
    err: List[str] = []
    res = CodeResult()
    with client._transport.server_stream(SERVICE, "RunCode", req, op="run code") as stream:
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
                res.error = r.get("error", "")
                res.timed_out = bool(r.get("timedOut", False))
                res.duration_ms = int(r.get("durationMs", 0))
                res.installed = list(r.get("installed", []))
                res.artifacts = [
                    Artifact(
                        name=a.get("name", ""),
                        format=a.get("format", ""),
                        mime=a.get("mime", ""),
                        size=int(a.get("size", 0)),
                        content=b64decode(a.get("content", "")),
                    )
                    for a in r.get("artifacts", [])
                ]
                v = r.get("value")
                if v is not None:
                    res.text = v.get("text", "")
                    res.png = b64decode(v["png"]) if v.get("png") else None
                    res.html = v.get("html") or None
                res.findings = [
                    PolicyFinding(
                        rule=f.get("rule", ""),
                        severity=f.get("severity", "SEVERITY_UNSPECIFIED").replace("SEVERITY_", "").lower(),
                        line=int(f.get("line", 0)),
                        column=int(f.get("column", 0)),
                        match=f.get("match", ""),
                        message=f.get("message", ""),
                    )
                    for f in r.get("findings", [])
                ]
    res.stdout, res.stderr = "".join(out), "".join(err)
    return res


class CodeContext:
    """A stateful kernel: variables, imports and the working directory
    survive between :meth:`run` calls. Closed when used as a context manager."""

    def __init__(self, client: "Client", info: Mapping[str, Any]) -> None:
        self._client = client
        self.id: str = info.get("id", "")
        self.sandbox: str = info.get("sandbox", "")
        self.language: str = info.get("language", "")

    def run(
        self,
        code: str,
        *,
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> CodeResult:
        """Run code in the context; ``result.text`` is the last expression's value."""
        req: Dict[str, Any] = {"context": self.id, "code": code}
        if timeout:
            req["timeoutMs"] = int(timeout * 1000)
        return run(self._client, req, on_stdout, on_stderr)

    def close(self) -> None:
        self._client._transport.unary(SERVICE, "CloseContext", {"context": self.id}, op=f"close context {self.id}")

    def __enter__(self) -> "CodeContext":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<sbx.CodeContext {self.id} {self.language} in {self.sandbox}>"
