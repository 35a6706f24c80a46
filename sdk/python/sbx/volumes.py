"""Named persistent volumes: ``client.volumes`` and ``volumes=`` at create."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ._transport import Transport
from .types import Size, _int, _ms_to_datetime, parse_size

__all__ = ["Volume", "VolumeMount", "Volumes", "volume_mounts_to_json"]

_SERVICE = "sbx.v1.VolumeService"


@dataclass(frozen=True)
class Volume:
    """A named volume: a size-bounded filesystem that outlives sandboxes and
    daemon restarts."""

    name: str
    #: Quota: the size of the volume's filesystem in bytes.
    size: int = 0
    #: Bytes in use.
    used: int = 0
    created_at: Optional[_dt.datetime] = None
    #: Ids of live sandboxes mounting it.
    sandboxes: List[str] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Volume":
        return cls(
            name=str(obj.get("name", "")),
            size=_int(obj, "sizeBytes"),
            used=_int(obj, "usedBytes"),
            created_at=_ms_to_datetime(_int(obj, "createdAtMs")),
            sandboxes=list(obj.get("sandboxes") or []),
        )


@dataclass(frozen=True)
class VolumeMount:
    """Mount volume ``volume`` at ``path`` (absolute) in a sandbox."""

    volume: str
    path: str
    read_only: bool = False

    @classmethod
    def parse(cls, spec: str) -> "VolumeMount":
        """Parse ``"NAME:/path[:ro|:rw]"`` (the CLI's ``-v`` syntax)."""
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise ValueError(f"volume mount {spec!r}: want NAME:/path[:ro]")
        ro = False
        if len(parts) == 3:
            if parts[2] not in ("ro", "rw"):
                raise ValueError(f"volume mount {spec!r}: mode must be ro or rw")
            ro = parts[2] == "ro"
        return cls(parts[0], parts[1], ro)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"volume": self.volume, "path": self.path}
        if self.read_only:
            out["readOnly"] = True
        return out


VolumeMountLike = Union[VolumeMount, str]


def volume_mounts_to_json(mounts: Sequence[VolumeMountLike]) -> List[Dict[str, Any]]:
    """The protojson form of ``volumes=`` (``VolumeMount`` or ``"NAME:/path[:ro]"``)."""
    out = []
    for m in mounts:
        if isinstance(m, str):
            m = VolumeMount.parse(m)
        elif not isinstance(m, VolumeMount):
            raise TypeError(f"volumes: want VolumeMount or 'NAME:/path[:ro]', got {type(m).__name__}")
        out.append(m.to_json())
    return out


class Volumes:
    """Manage named volumes. Obtain it as :attr:`Client.volumes`::

        client.volumes.create("cache", size="2G")
        sb = client.create(volumes=["cache:/cache"])
    """

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, name: str, size: Optional[Size] = None) -> Volume:
        """Create volume ``name`` (``[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}``) with a
        size quota (bytes or ``"1G"``; default 1 GiB).

        Raises:
            AlreadyExistsError: the name is taken.
            InvalidArgumentError: a bad name or size.
        """
        req: Dict[str, Any] = {"name": name}
        if size is not None:
            req["sizeBytes"] = str(parse_size(size))
        resp = self._t.unary(_SERVICE, "CreateVolume", req, op=f"create volume {name}")
        return Volume.from_json(resp.get("volume") or {})

    def list(self) -> List[Volume]:
        """Every volume."""
        resp = self._t.unary(_SERVICE, "ListVolumes", {}, op="list volumes")
        return [Volume.from_json(v) for v in resp.get("volumes") or []]

    def get(self, name: str) -> Volume:
        """Describe one volume.

        Raises:
            NotFoundError: no such volume.
        """
        resp = self._t.unary(_SERVICE, "GetVolume", {"name": name}, op=f"get volume {name}")
        return Volume.from_json(resp.get("volume") or {})

    def remove(self, name: str) -> None:
        """Delete a volume and its data.

        Raises:
            FailedPreconditionError: a sandbox still mounts it.
            NotFoundError: no such volume.
        """
        self._t.unary(_SERVICE, "RemoveVolume", {"name": name}, op=f"remove volume {name}")
