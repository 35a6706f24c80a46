"""Ports of sandboxes, reached through the daemon's proxy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

__all__ = ["Port", "SERVICE"]

SERVICE = "sbx.v1.PortService"


@dataclass(frozen=True)
class Port:
    """How to reach a TCP port of a sandbox through the daemon.

    Requests to these addresses need the daemon's token when it has one
    (``Authorization: Bearer``, ``X-Sbx-Token``, or ``?sbx_token=`` once in a
    browser, which sets a cookie); the token never reaches the sandbox.
    """

    port: int
    #: HTTP URL routed by path: ``<daemon>/proxy/<id>/<port>/``.
    url: str
    #: WebSocket URL (``ws://`` or ``wss://``) routed by path.
    websocket_url: str
    #: Raw TCP endpoint (HTTP/1.1 ``GET`` with ``Upgrade: sbx-tcp``).
    tcp_url: str
    #: URL routed by host name; ``""`` unless the daemon has ``--proxy-domain``.
    host_url: str = ""
    #: Headers that route a request sent to the daemon's own address.
    headers: Dict[str, str] = field(default_factory=dict)
    #: Address the socket is bound to inside the sandbox (from ``ports()``).
    bind_address: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Port":
        return cls(
            port=int(d.get("port", 0)),
            url=d.get("url", ""),
            websocket_url=d.get("websocketUrl", ""),
            tcp_url=d.get("tcpUrl", ""),
            host_url=d.get("hostUrl", ""),
            headers=dict(d.get("headers") or {}),
            bind_address=d.get("bindAddress", ""),
        )
