"""Ports through the daemon's proxy, and the API token."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

import sbx
from conftest import SBX_BIN, _free_port, _healthy

SERVER = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def _wait_port(sb: sbx.Sandbox, port: int) -> sbx.Port:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for p in sb.ports():
            if p.port == port:
                return p
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on {port} in 30s")


def test_get_host_and_ports(make_sandbox) -> None:
    sb = make_sandbox(command=["/usr/bin/python3", "-c", SERVER])
    listed = _wait_port(sb, 8000)
    assert listed.bind_address == "127.0.0.1"
    url = sb.get_host(8000)
    assert url.endswith(f"/proxy/{sb.id}/8000/")
    p = sb.get_port(8000)
    assert p.url == url and p.websocket_url.startswith("ws://")
    assert p.headers == {"E2b-Sandbox-Id": sb.id, "E2b-Sandbox-Port": "8000"}
    with urllib.request.urlopen(url + "hello?x=1", timeout=30) as r:
        got = json.load(r)
    assert got["path"] == "/hello?x=1"
    with pytest.raises(sbx.InvalidArgumentError):
        sb.get_port(0)

    import asyncio

    from sbx.aio import AsyncSandbox

    assert asyncio.run(AsyncSandbox(sb).get_host(8000)) == url


def test_token_from_argument_and_environment(monkeypatch) -> None:
    monkeypatch.setenv("SBX_TOKEN", "from-env")
    assert sbx.Client("127.0.0.1:1")._transport.auth_headers() == {"Authorization": "Bearer from-env"}
    assert sbx.Client("127.0.0.1:1", token="given")._transport.auth_headers() == {"Authorization": "Bearer given"}
    monkeypatch.delenv("SBX_TOKEN")
    assert sbx.Client("127.0.0.1:1")._transport.auth_headers() == {}


def test_daemon_with_token() -> None:
    if os.geteuid() != 0 or not os.access(SBX_BIN, os.X_OK):
        pytest.skip("needs root and bin/sbx")
    token = "py-test-token-0123456789abcdef"
    data = tempfile.mkdtemp(prefix="sbx-pytest-auth-")
    os.chmod(data, 0o711)
    addr = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, SBX_AUTH_TOKEN=token)
    log = open(os.path.join(data, "daemon.log"), "wb")
    proc = subprocess.Popen(
        [SBX_BIN, "serve", "--listen", addr, "--data-dir", os.path.join(data, "d"), "--warm-pool", "0", "--network=false"],
        env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _healthy(addr):  # /healthz needs no token
            assert proc.poll() is None, "the daemon exited: " + open(os.path.join(data, "daemon.log")).read()[-2000:]
            assert time.monotonic() < deadline, "the daemon did not come up"
            time.sleep(0.1)
        with pytest.raises(sbx.UnauthenticatedError):
            sbx.Client(addr, token="").version()
        with pytest.raises(sbx.UnauthenticatedError):
            sbx.Client(addr, token="wrong").version()
        assert sbx.Client(addr, token=token).version()["version"]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{addr}/proxy/sb-x/80/", timeout=10)
        assert e.value.code == 401
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        import shutil

        shutil.rmtree(data, ignore_errors=True)
