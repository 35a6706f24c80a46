"""Plain data types of the sbx API, decoded from the daemon's JSON.

Enum values are exposed as short lower-case strings: a sandbox's state is
``"running"`` rather than ``SANDBOX_STATE_RUNNING``, a file's type ``"dir"``
rather than ``FILE_TYPE_DIR``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from ._transport import b64decode

__all__ = [
    "Resources",
    "SandboxStats",
    "NetworkPolicy",
    "DomainSecret",
    "SandboxInfo",
    "FileInfo",
    "ImageConfig",
    "ImageInfo",
    "LayerProgress",
    "ImageProgress",
    "parse_size",
]

Size = Union[int, str]


def parse_size(value: Optional[Size]) -> int:
    """Parse a byte size: an int, or a string like ``"512M"``, ``"1.5G"``,
    ``"64KiB"`` (binary units K, M, G, T). ``None`` and ``""`` mean 0."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError("a size must be an int or a string like '512M'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size {value} must not be negative")
        return value
    if isinstance(value, float):
        if value < 0:
            raise ValueError(f"size {value} must not be negative")
        return int(value)
    text = str(value).strip().lower()
    if not text:
        return 0
    t = text
    if t.endswith("b"):
        t = t[:-1]
    if t.endswith("i"):
        t = t[:-1]
    mult = 1
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in units:
        mult = units[t[-1]]
        t = t[:-1]
    try:
        f = float(t)
    except ValueError:
        raise ValueError(f"bad size {value!r}: want e.g. 512M or 1G") from None
    if f < 0:
        raise ValueError(f"bad size {value!r}: must not be negative")
    return int(f * mult)


def _int(obj: Mapping[str, Any], key: str) -> int:
    v = obj.get(key)
    if v is None or v == "":
        return 0
    return int(v)


def _enum(value: Optional[str], prefix: str) -> str:
    if not value:
        return "unspecified"
    if isinstance(value, int):  # protojson may emit numbers for unknown values
        return str(value)
    return value[len(prefix):].lower() if value.startswith(prefix) else value.lower()


def _ms_to_datetime(ms: int) -> Optional[_dt.datetime]:
    if not ms:
        return None
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)


@dataclass(frozen=True)
class Resources:
    """Resource limits of a sandbox."""

    memory_bytes: int = 0
    #: CPU limit in CPUs (fractions allowed: 0.5 is half a CPU).
    cpu: float = 0.0
    pids: int = 0
    disk_bytes: int = 0

    @classmethod
    def from_json(cls, obj: Optional[Mapping[str, Any]]) -> "Resources":
        obj = obj or {}
        return cls(
            memory_bytes=_int(obj, "memoryBytes"),
            cpu=_int(obj, "cpuMillis") / 1000.0,
            pids=_int(obj, "pids"),
            disk_bytes=_int(obj, "diskBytes"),
        )


@dataclass(frozen=True)
class SandboxStats:
    """Live usage of a sandbox (filled by :meth:`Sandbox.refresh`)."""

    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    cpu_usage_ns: int = 0
    pids: int = 0
    disk_used_bytes: int = 0

    @classmethod
    def from_json(cls, obj: Optional[Mapping[str, Any]]) -> "SandboxStats":
        obj = obj or {}
        return cls(
            memory_bytes=_int(obj, "memoryBytes"),
            memory_peak_bytes=_int(obj, "memoryPeakBytes"),
            cpu_usage_ns=_int(obj, "cpuUsageNs"),
            pids=_int(obj, "pids"),
            disk_used_bytes=_int(obj, "diskUsedBytes"),
        )


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's network policy. ``mode`` is ``"public"``, ``"none"`` or
    ``"allow"`` (``"unspecified"`` means the daemon's default, public)."""

    mode: str = "unspecified"
    allow_cidrs: List[str] = field(default_factory=list)
    allow_domains: List[str] = field(default_factory=list)
    deny_cidrs: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj: Optional[Mapping[str, Any]]) -> "NetworkPolicy":
        obj = obj or {}
        return cls(
            mode=_enum(obj.get("mode"), "NETWORK_MODE_"),
            allow_cidrs=list(obj.get("allowCidrs") or []),
            allow_domains=list(obj.get("allowDomains") or []),
            deny_cidrs=list(obj.get("denyCidrs") or []),
        )

    def to_json(self) -> Dict[str, Any]:
        """The protojson form of the policy."""
        out: Dict[str, Any] = {}
        if self.mode and self.mode != "unspecified":
            out["mode"] = "NETWORK_MODE_" + self.mode.upper()
        if self.allow_cidrs:
            out["allowCidrs"] = list(self.allow_cidrs)
        if self.allow_domains:
            out["allowDomains"] = list(self.allow_domains)
        if self.deny_cidrs:
            out["denyCidrs"] = list(self.deny_cidrs)
        return out


_PERMISSIONS = ("none", "view", "read", "write")
_PATTERN_TYPES = ("glob", "directory", "file")


@dataclass(frozen=True)
class PermissionRule:
    """One rule of a :class:`PathPolicy`. ``pattern`` is relative to the
    guarded directory (``"/"`` is its root); ``permission`` is ``"none"``
    (hidden), ``"view"`` (listed, not readable), ``"read"`` or ``"write"``;
    ``type`` is ``"glob"`` (gitignore-like), ``"directory"`` (it and
    everything below) or ``"file"``. The highest ``priority`` wins, then file
    over directory over glob, then the longer pattern. ``case_insensitive``
    matches the pattern regardless of case (``"*.pem"`` also matches
    ``"KEY.PEM"``), as the presets' hiding rules do."""

    pattern: str
    permission: str
    type: str = "glob"
    priority: int = 0
    case_insensitive: bool = False

    def __post_init__(self) -> None:
        if self.permission not in _PERMISSIONS:
            raise ValueError(f"permission {self.permission!r}: want one of {', '.join(_PERMISSIONS)}")
        if self.type not in _PATTERN_TYPES:
            raise ValueError(f"type {self.type!r}: want one of {', '.join(_PATTERN_TYPES)}")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "PermissionRule":
        typ = _enum(obj.get("type"), "PATTERN_TYPE_")
        return cls(
            pattern=str(obj.get("pattern", "")),
            permission=_enum(obj.get("permission"), "PERMISSION_"),
            type="glob" if typ == "unspecified" else typ,
            priority=int(obj.get("priority") or 0),
            case_insensitive=bool(obj.get("caseInsensitive", False)),
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "pattern": self.pattern,
            "permission": "PERMISSION_" + self.permission.upper(),
            "type": "PATTERN_TYPE_" + self.type.upper(),
            "priority": int(self.priority),
            "caseInsensitive": bool(self.case_insensitive),
        }


@dataclass(frozen=True)
class PathPolicy:
    """Guards directory ``path`` of a sandbox with permission rules, enforced
    for every process in it and for the file API. ``preset`` is
    ``"view-only"``, ``"read-only"``, ``"agent-safe"``, ``"development"``,
    ``"full-access"`` or ``""``; ``rules`` extend or override it; ``default``
    is the permission of paths no rule matches (``""``: the preset's, else
    ``"write"``)."""

    path: str
    preset: str = ""
    rules: List[PermissionRule] = field(default_factory=list)
    default: str = ""

    def __post_init__(self) -> None:
        if self.default and self.default not in _PERMISSIONS:
            raise ValueError(f"default {self.default!r}: want one of {', '.join(_PERMISSIONS)}")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "PathPolicy":
        default = _enum(obj.get("defaultPermission"), "PERMISSION_")
        return cls(
            path=str(obj.get("path", "")),
            preset=str(obj.get("preset", "")),
            rules=[PermissionRule.from_json(r) for r in obj.get("rules") or []],
            default="" if default == "unspecified" else default,
        )

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"path": self.path}
        if self.preset:
            out["preset"] = self.preset
        if self.rules:
            out["rules"] = [r.to_json() for r in self.rules]
        if self.default:
            out["defaultPermission"] = "PERMISSION_" + self.default.upper()
        return out


@dataclass(frozen=True)
class DomainSecret:
    """A secret only the listed hosts receive, over HTTPS, where you say.

    The sandbox sees a placeholder (``sbx-secret-<name>-<random>``) in
    environment variable ``name``. The daemon's egress proxy puts ``value``
    in its place only in HTTPS requests (re-originated to a server whose
    certificate verified) to ``domains``, and there only in the ``headers``
    named (``Authorization`` when none is) and, with ``allow_query``, in the
    URL query string; everything else keeps the placeholder. Over plain HTTP
    a request carrying the placeholder to those hosts is refused. A host
    that echoes request headers hands the value back to the sandbox: list
    only hosts you trust with it. ``"*.example.com"`` matches the names
    below example.com, not example.com itself. The daemon never returns
    ``value``: in :class:`SandboxInfo` it is ``""``.
    """

    name: str
    value: str = field(default="", repr=False)
    domains: List[str] = field(default_factory=list)
    headers: List[str] = field(default_factory=list)
    allow_query: bool = False

    def to_json(self) -> Dict[str, Any]:
        if isinstance(self.domains, str):
            raise TypeError("DomainSecret.domains must be a list of host names")
        if isinstance(self.headers, str):
            raise TypeError("DomainSecret.headers must be a list of header names")
        out: Dict[str, Any] = {"name": self.name, "value": self.value, "domains": list(self.domains)}
        if self.headers:
            out["headers"] = list(self.headers)
        if self.allow_query:
            out["allowQuery"] = True
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "DomainSecret":
        return cls(
            name=str(obj.get("name", "")),
            domains=list(obj.get("domains") or []),
            headers=list(obj.get("headers") or []),
            allow_query=bool(obj.get("allowQuery", False)),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A snapshot of a sandbox as the daemon describes it."""

    id: str
    name: str = ""
    state: str = "unspecified"
    state_detail: str = ""
    image: str = ""
    image_digest: str = ""
    runtime: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    secret_names: List[str] = field(default_factory=list)
    #: Domain secrets: names and domains (values are never returned).
    domain_secrets: List[DomainSecret] = field(default_factory=list)
    command: List[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""
    resources: Resources = field(default_factory=Resources)
    #: Lifetime and idle timeout in seconds (0: none).
    timeout: float = 0.0
    idle_timeout: float = 0.0
    idle_action: str = "unspecified"
    created_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    last_active_at: Optional[_dt.datetime] = None
    stats: Optional[SandboxStats] = None
    network: Optional[NetworkPolicy] = None
    ip_address: str = ""
    #: Volume mounts as the daemon's JSON ({"volume", "path", "readOnly"}).
    volumes: List[Dict[str, Any]] = field(default_factory=list)
    #: Guarded directories (codebases' included).
    path_policies: List[PathPolicy] = field(default_factory=list)
    #: The sandbox whose scoped token created this one ("" if none did).
    parent: str = ""
    #: Whether the sandbox holds a scoped API token ($SBX_TOKEN inside it).
    scoped_token: bool = False
    #: Whether using the sandbox while it is stopped starts it.
    auto_resume: bool = False
    #: The raw JSON the daemon sent.
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=str(obj.get("id", "")),
            name=str(obj.get("name", "")),
            state=_enum(obj.get("state"), "SANDBOX_STATE_"),
            state_detail=str(obj.get("stateDetail", "")),
            image=str(obj.get("image", "")),
            image_digest=str(obj.get("imageDigest", "")),
            runtime=str(obj.get("runtime", "")),
            labels=dict(obj.get("labels") or {}),
            env=dict(obj.get("env") or {}),
            secret_names=list(obj.get("secretNames") or []),
            domain_secrets=[DomainSecret.from_json(d) for d in obj.get("domainSecrets") or []],
            command=list(obj.get("command") or []),
            workdir=str(obj.get("workdir", "")),
            user=str(obj.get("user", "")),
            resources=Resources.from_json(obj.get("resources")),
            timeout=_int(obj, "timeoutMs") / 1000.0,
            idle_timeout=_int(obj, "idleTimeoutMs") / 1000.0,
            idle_action=_enum(obj.get("idleAction"), "IDLE_ACTION_"),
            created_at=_ms_to_datetime(_int(obj, "createdAtMs")),
            expires_at=_ms_to_datetime(_int(obj, "expiresAtMs")),
            last_active_at=_ms_to_datetime(_int(obj, "lastActiveAtMs")),
            stats=SandboxStats.from_json(obj["stats"]) if obj.get("stats") is not None else None,
            network=NetworkPolicy.from_json(obj["network"]) if obj.get("network") is not None else None,
            ip_address=str(obj.get("ipAddress", "")),
            volumes=[dict(v) for v in obj.get("volumes") or []],
            path_policies=[PathPolicy.from_json(p) for p in obj.get("pathPolicies") or []],
            parent=str(obj.get("parent", "")),
            scoped_token=bool(obj.get("scopedToken", False)),
            auto_resume=bool(obj.get("autoResume", False)),
            raw=dict(obj),
        )


@dataclass(frozen=True)
class FileInfo:
    """One file or directory of a sandbox. ``type`` is ``"file"``, ``"dir"``,
    ``"symlink"`` or ``"other"``."""

    path: str
    name: str = ""
    type: str = "unspecified"
    size: int = 0
    #: Permission bits, e.g. ``0o644``.
    mode: int = 0
    mtime: Optional[_dt.datetime] = None
    symlink_target: str = ""
    uid: int = 0
    gid: int = 0

    @property
    def is_dir(self) -> bool:
        """Whether this is a directory."""
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        """Whether this is a regular file."""
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        """Whether this is a symbolic link."""
        return self.type == "symlink"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "FileInfo":
        return cls(
            path=str(obj.get("path", "")),
            name=str(obj.get("name", "")),
            type=_enum(obj.get("type"), "FILE_TYPE_"),
            size=_int(obj, "size"),
            mode=_int(obj, "mode"),
            mtime=_ms_to_datetime(_int(obj, "mtimeMs")),
            symlink_target=str(obj.get("symlinkTarget", "")),
            uid=_int(obj, "uid"),
            gid=_int(obj, "gid"),
        )


@dataclass(frozen=True)
class ImageConfig:
    """The run configuration stored in an image."""

    env: List[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""
    entrypoint: List[str] = field(default_factory=list)
    cmd: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Optional[Mapping[str, Any]]) -> "ImageConfig":
        obj = obj or {}
        return cls(
            env=list(obj.get("env") or []),
            workdir=str(obj.get("workdir", "")),
            user=str(obj.get("user", "")),
            entrypoint=list(obj.get("entrypoint") or []),
            cmd=list(obj.get("cmd") or []),
            labels=dict(obj.get("labels") or {}),
        )


@dataclass(frozen=True)
class ImageInfo:
    """An image stored by the daemon."""

    ref: str
    digest: str = ""
    size_bytes: int = 0
    layers: int = 0
    created_at: Optional[_dt.datetime] = None
    config: ImageConfig = field(default_factory=ImageConfig)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "ImageInfo":
        return cls(
            ref=str(obj.get("ref", "")),
            digest=str(obj.get("digest", "")),
            size_bytes=_int(obj, "sizeBytes"),
            layers=_int(obj, "layers"),
            created_at=_ms_to_datetime(_int(obj, "createdAtMs")),
            config=ImageConfig.from_json(obj.get("config")),
        )


@dataclass(frozen=True)
class LayerProgress:
    """Progress of one layer of a pull. ``phase`` is ``"downloading"``,
    ``"unpacking"``, ``"done"`` or ``"cached"``."""

    digest: str = ""
    current_bytes: int = 0
    total_bytes: int = 0
    phase: str = ""

    @classmethod
    def from_json(cls, obj: Optional[Mapping[str, Any]]) -> "LayerProgress":
        obj = obj or {}
        return cls(
            digest=str(obj.get("digest", "")),
            current_bytes=_int(obj, "currentBytes"),
            total_bytes=_int(obj, "totalBytes"),
            phase=str(obj.get("phase", "")),
        )


@dataclass(frozen=True)
class ImageProgress:
    """One event of a pull or build. ``kind`` says which field is set:
    ``"status"`` (a human-readable step), ``"layer"``, ``"step"``, ``"log"``
    or ``"done"`` (the finished image, last)."""

    kind: str
    status: str = ""
    layer: Optional[LayerProgress] = None
    done: Optional[ImageInfo] = None
    step: Optional[Dict[str, Any]] = None
    log: bytes = b""

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "ImageProgress":
        if "done" in obj:
            return cls(kind="done", done=ImageInfo.from_json(obj["done"] or {}))
        if "layer" in obj:
            return cls(kind="layer", layer=LayerProgress.from_json(obj["layer"]))
        if "step" in obj:
            return cls(kind="step", step=dict(obj["step"] or {}))
        if "log" in obj:
            return cls(kind="log", log=b64decode(obj["log"] or ""))
        if "status" in obj:
            return cls(kind="status", status=str(obj["status"]))
        return cls(kind="unknown")

    def __str__(self) -> str:
        if self.kind == "status":
            return self.status
        if self.kind == "layer" and self.layer is not None:
            lp = self.layer
            return f"{lp.digest[:19]} {lp.phase} {lp.current_bytes}/{lp.total_bytes}"
        if self.kind == "done" and self.done is not None:
            return f"done {self.done.ref} {self.done.digest}"
        if self.kind == "log":
            return self.log.decode("utf-8", "replace")
        return f"{self.kind} {self.step or ''}"
