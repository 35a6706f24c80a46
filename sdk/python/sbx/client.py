"""The connection to one sbx daemon."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from ._transport import DEFAULT_ADDR, Transport
from .codebase import Codebases
from .images import Images
from .tenants import Tenant, Tenants
from .volumes import Volumes

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["Client", "DEFAULT_ADDR", "selectors_from_labels"]


def selectors_from_labels(
    labels: Optional[Mapping[str, Optional[str]]] = None, selectors: Optional[Sequence[str]] = None
) -> List[str]:
    """Turn ``{"k": "v"}`` into ``["k=v"]`` (a ``None`` value means "has key
    k") and append raw ``selectors`` (``"k=v"``, ``"k!=v"``, ``"k"``, ``"!k"``)."""
    out: List[str] = []
    for k, v in (labels or {}).items():
        out.append(k if v is None else f"{k}={v}")
    out.extend(selectors or [])
    return out


class Client:
    """A client of the sbx daemon at ``addr``. Safe to share between threads.

    Args:
        addr: ``"host:port"`` or an ``http(s)://`` URL. ``None`` means
            ``$SBX_ADDR``, else ``127.0.0.1:7777``.
        timeout: deadline in seconds of unary calls (``None``: none). Streams
            (exec output, file transfers) are not bounded by it.
        token: the daemon's API token (``sbx serve --auth-token-file``).
            ``None`` means ``$SBX_TOKEN``; without one no token is sent.
        cacert: PEM file of CAs to trust for an ``https://`` daemon (a
            private CA); ``None`` means ``$SBX_CACERT``.
        file_compression: gzip file transfers (``sandbox.files`` reads,
            writes and tars) in both directions. The daemon sends file data
            uncompressed unless a client asks for it this way: on loopback
            or a LAN gzip is several times slower than the link, so ask only
            over a slow link and for data that compresses (source trees,
            logs), never for binaries or archives.

    Example::

        client = sbx.Client()
        with client.create(memory="256M") as sb:
            print(sb.run("echo hi").stdout)
    """

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        token: Optional[str] = None,
        cacert: Optional[str] = None,
        file_compression: bool = False,
    ) -> None:
        self._transport = Transport(
            addr, timeout=timeout, token=token, cacert=cacert, file_compression=file_compression
        )
        #: Image management (pull, list, remove, prune, import, export).
        self.images = Images(self._transport)
        #: Named persistent volumes (create, list, get, remove).
        self.volumes = Volumes(self._transport)
        #: Codebases (upload with ``from_local``, list, get, download, delete, sync).
        self.codebases = Codebases(self._transport)
        #: Tenants (``current()``; ``list()`` and ``get()`` with the admin token).
        self.tenants = Tenants(self._transport)

    @property
    def addr(self) -> str:
        """The daemon's address."""
        return self._transport.addr

    def version(self) -> Dict[str, Any]:
        """The daemon's version and runtimes, as the daemon's JSON."""
        return self._transport.unary("sbx.v1.SandboxService", "Version", {}, op="version")

    def tenant(self) -> Tenant:
        """The token's tenant: its quotas and what it uses against them."""
        return self.tenants.current()

    def create(self, **kwargs: Any) -> "Sandbox":
        """Create a sandbox; takes the keyword arguments of :meth:`Sandbox.create`."""
        from .sandbox import Sandbox

        return Sandbox.create(client=self, **kwargs)

    def get(self, ref: str) -> "Sandbox":
        """Find a sandbox by id or name. The handle does not own it: leaving
        its ``with`` block leaves the sandbox running.

        Raises:
            NotFoundError: no such sandbox.
        """
        from .sandbox import Sandbox

        return Sandbox.from_id(ref, client=self)

    def list(
        self,
        labels: Optional[Mapping[str, Optional[str]]] = None,
        selectors: Optional[Sequence[str]] = None,
    ) -> List["Sandbox"]:
        """Sandboxes whose labels match all of ``labels`` and ``selectors``."""
        from .sandbox import Sandbox

        return Sandbox.list(labels=labels, selectors=selectors, client=self)

    def __repr__(self) -> str:
        return f"sbx.Client({self.addr!r})"
