"""Tenants: ``client.tenant()`` (the token's own quotas and usage) and, with
the daemon's admin token, ``client.tenants.list()`` / ``.get(name)``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping

from ._transport import Transport
from .types import _int

__all__ = ["Tenant", "TenantQuotas", "TenantUsage", "Tenants"]

_SERVICE = "sbx.v1.TenantService"


@dataclass(frozen=True)
class TenantQuotas:
    """What a tenant may hold at a time; 0 means unlimited."""

    max_sandboxes: int = 0
    memory: int = 0
    cpu_millis: int = 0
    disk: int = 0
    #: Images, volumes (at their full size) and codebases together, in bytes.
    storage: int = 0

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TenantQuotas":
        return cls(
            max_sandboxes=_int(obj, "maxSandboxes"), memory=_int(obj, "memoryBytes"), cpu_millis=_int(obj, "cpuMillis"),
            disk=_int(obj, "diskBytes"), storage=_int(obj, "storageBytes"),
        )


@dataclass(frozen=True)
class TenantUsage:
    """What a tenant holds now, in the quotas' terms (bytes)."""

    sandboxes: int = 0
    memory: int = 0
    cpu_millis: int = 0
    disk: int = 0
    #: ``images + volumes + codebases``.
    storage: int = 0
    images: int = 0
    volumes: int = 0
    codebases: int = 0

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TenantUsage":
        return cls(
            sandboxes=_int(obj, "sandboxes"), memory=_int(obj, "memoryBytes"), cpu_millis=_int(obj, "cpuMillis"),
            disk=_int(obj, "diskBytes"), storage=_int(obj, "storageBytes"), images=_int(obj, "imagesBytes"),
            volumes=_int(obj, "volumesBytes"), codebases=_int(obj, "codebasesBytes"),
        )


@dataclass(frozen=True)
class Tenant:
    """A tenant with its quotas and usage. ``name`` is ``""`` for the owner
    of a single-user daemon (no tenants file, no quotas)."""

    name: str
    quotas: TenantQuotas = field(default_factory=TenantQuotas)
    usage: TenantUsage = field(default_factory=TenantUsage)
    #: For a scoped sandbox token: the sandbox whose children it manages.
    scope_sandbox: str = ""
    #: How many API tokens the tenant has (admin views only).
    tokens: int = 0

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Tenant":
        return cls(
            name=str(obj.get("name", "")),
            quotas=TenantQuotas.from_json(obj.get("quotas") or {}),
            usage=TenantUsage.from_json(obj.get("usage") or {}),
            scope_sandbox=str(obj.get("scopeSandbox", "")),
            tokens=_int(obj, "tokens"),
        )


class Tenants:
    """Tenants of the daemon. Obtain it as :attr:`Client.tenants`::

        me = client.tenants.current()
        print(me.usage.storage, "of", me.quotas.storage or "unlimited")
    """

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def current(self) -> Tenant:
        """The client's own tenant: its quotas and usage."""
        resp = self._t.unary(_SERVICE, "GetTenant", {}, op="get tenant")
        return Tenant.from_json(resp.get("tenant") or {})

    def get(self, name: str) -> Tenant:
        """Describe tenant ``name`` (the daemon's admin token only).

        Raises:
            NotFoundError: no such tenant (or, for a tenant's token, any but its own).
        """
        resp = self._t.unary(_SERVICE, "GetTenant", {"name": name}, op=f"get tenant {name}")
        return Tenant.from_json(resp.get("tenant") or {})

    def list(self) -> List[Tenant]:
        """Every tenant with its quotas and usage (the daemon's admin token only).

        Raises:
            PermissionDeniedError: not the admin token.
            FailedPreconditionError: the daemon runs without a tenants file.
        """
        resp = self._t.unary(_SERVICE, "ListTenants", {}, op="list tenants")
        return [Tenant.from_json(t) for t in resp.get("tenants") or []]
