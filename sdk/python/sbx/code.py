"""Running code: one-shot runs, stateful contexts, artifacts and code policy.

Use it through :meth:`sbx.Sandbox.run_code` and
:meth:`sbx.Sandbox.create_context`::

    res = sb.run_code("import matplotlib.pyplot as plt; plt.plot([1, 2])")
    for a in res.artifacts:
        a.save("out")          # out/figure-1.png
    res.plots[0].format        # "png"; .content_base64 as llm-sandbox gives it

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

__all__ = ["Artifact", "CodeContext", "CodeResult", "Plot", "PolicyFinding"]

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
class Plot:
    """An image artifact (a figure shown or left open, a displayed image) in
    llm-sandbox's shape: base64 content and its format ("png", "svg", "jpeg")."""

    content_base64: str
    format: str
    name: str = ""

    @property
    def content(self) -> bytes:
        """The image itself."""
        import base64

        return base64.b64decode(self.content_base64)

    def save(self, path: str) -> str:
        """Write the image to ``path`` (a directory: ``<path>/<name>``, or
        ``plot.<format>`` for an unnamed one); returns the file written."""
        import os

        if os.path.isdir(path):
            path = os.path.join(path, os.path.basename(self.name) or f"plot.{self.format or 'png'}")
        with open(path, "wb") as f:
            f.write(self.content)
        return path


def plots_of(artifacts: Sequence[Artifact]) -> List[Plot]:
    """The image artifacts as :class:`Plot`, in artifact order."""
    import base64

    return [
        Plot(content_base64=base64.b64encode(a.content).decode("ascii"), format=a.format, name=a.name)
        for a in artifacts
        if a.mime.startswith("image/") and a.content
    ]


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
    #: The image artifacts again, llm-sandbox style (base64 + format).
    plots: List[Plot] = field(default_factory=list)
    #: The last expression's value (contexts): text, png bytes, html.
    text: Optional[str] = None
    png: Optional[bytes] = None
    html: Optional[str] = None
    findings: List[PolicyFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error


LANGUAGES = frozenset(
    "python py python3 javascript js node nodejs typescript ts bash sh shell go golang java cpp c++ cxx ruby rb r rscript".split()
)


def code_and_language(code: Optional[str], language: Optional[str]) -> "tuple[str, str]":
    """Sorts out run_code's arguments: (code, language="python"), or the
    older (language, code) when the first is a language name and the
    second is not."""
    if code is None:
        raise TypeError("run_code() missing the code to run")
    if (
        language is not None
        and code.strip().lower() in LANGUAGES
        and language.strip().lower() not in LANGUAGES
    ):
        code, language = language, code
    return code, language or "python"


def _severity(value: Any, what: str) -> str:
    """The wire name of a severity given as "critical", "SEVERITY_CRITICAL"
    (any case) or its number; anything else is a ValueError (the server
    would silently read an unknown name as unset, i.e. medium)."""
    names = list(_SEVERITIES.values())
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(names):
        return names[value - 1]
    if isinstance(value, str):
        v = value.strip().lower()
        v = v[len("severity_"):] if v.startswith("severity_") else v
        if v in _SEVERITIES:
            return _SEVERITIES[v]
    raise ValueError(f"{what}: unknown severity {value!r} (one of {', '.join(_SEVERITIES)})")


def _rule(r: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(r)
    if out.get("severity") not in (None, ""):
        out["severity"] = _severity(out["severity"], f"policy rule {out.get('id', '')!r}")
    return out


def policy_request(
    policy: Optional[Sequence[str]], enforce: bool, threshold: Optional[str], rules: Optional[Sequence[Mapping[str, Any]]]
) -> Optional[Dict[str, Any]]:
    if not policy and not rules:
        return None
    req: Dict[str, Any] = {"presets": list(policy or []), "mode": "POLICY_MODE_ENFORCE" if enforce else "POLICY_MODE_ADVISORY"}
    if rules:
        req["rules"] = [_rule(r) for r in rules]
    if threshold:
        req["threshold"] = _severity(threshold, "threshold")
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
                res.plots = plots_of(res.artifacts)
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
