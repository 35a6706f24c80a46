"""The raw file route (``/sbx/v1/files``) against a scripted fake daemon:
what the SDK sends, how it reads answers cut short, errors with their codes,
and the fallback to the Connect calls for a daemon without the route."""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

import pytest

import sbx
from sbx import _proto as P
from sbx._transport import Transport

from test_transport import chunked, end_stream, fake, frame, response, run_bounded  # noqa: F401  (fixture)


def raw_files(d: Any) -> sbx.Files:
    return sbx.Files(Transport(d.addr), "sb-1")


def plain(status: str, body: bytes, content_type: str = "application/json", length: int = -1) -> bytes:
    n = len(body) if length < 0 else length
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def query(req: Any) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(req.path).query))


def route(on_get: Any, on_put: Any) -> Any:
    """A fake raw route: the probe (a GET without a path) gets the route's
    400, other GETs on_get, PUTs on_put."""

    def answer(req: Any) -> bytes:
        assert req.path.startswith("/sbx/v1/files?") or req.path == "/sbx/v1/files?", req.path
        if req.method == "GET" and "path" not in query(req):
            return plain("400 Bad Request", b'{"code":"invalid_argument","message":"needs the sandbox and path"}')
        return on_get(req) if req.method == "GET" else on_put(req)

    return answer


def test_raw_read_and_write(fake: Any, tmp_path: Any) -> None:
    data = os.urandom(3 << 20)
    d = fake(route(lambda req: plain("200 OK", data, "application/octet-stream"),
                   lambda req: plain("200 OK", json.dumps({"bytes_written": len(req.body)}).encode())))
    f = raw_files(d)
    assert run_bounded(lambda: f.read("/x", offset=5, length=7)) == data
    get = d.requests[0]
    assert get.method == "GET" and query(get) == {"sandbox": "sb-1", "path": "/x", "offset": "5", "length": "7"}
    # bytes in one send, and a file with sendfile, from where it stands.
    assert run_bounded(lambda: f.write("/y", data, 0o600)) == len(data)
    p = tmp_path / "src"
    p.write_bytes(b"skip" + data)
    with open(p, "rb") as src:
        src.read(4)
        assert run_bounded(lambda: f.write("/z", src)) == len(data)
    puts = [r for r in d.requests if r.method == "PUT"]
    assert [query(r)["path"] for r in puts] == ["/y", "/z"]
    assert query(puts[0])["mode"] == "600"
    assert all(r.body == data for r in puts), "the bodies differ from what was written"
    assert all(r.headers["content-length"] == str(len(data)) for r in puts)
    # Small writes stay on the Connect call.
    assert not any(r.method == "POST" for r in d.requests)


def test_raw_read_cut_short(fake: Any) -> None:
    d = fake(route(lambda req: plain("200 OK", b"x" * 500, "application/octet-stream", length=1000), None))
    with pytest.raises(sbx.SbxError) as ei:
        run_bounded(lambda: raw_files(d).read("/x"))
    assert ei.value.code == "unavailable" and "cut off" in str(ei.value), str(ei.value)


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_raw_errors_keep_their_code(fake: Any, method: str) -> None:
    err = plain("429 Too Many Requests", b'{"code":"resource_exhausted","message":"write /y: no space left on device"}')
    d = fake(route(lambda req: err, lambda req: err))
    with pytest.raises(sbx.SbxError) as ei:
        if method == "GET":
            run_bounded(lambda: raw_files(d).read("/y"))
        else:
            run_bounded(lambda: raw_files(d).write("/y", os.urandom(2 << 20)))
    assert ei.value.code == "resource_exhausted" and "no space left" in str(ei.value), str(ei.value)


def test_old_daemon_falls_back(fake: Any) -> None:
    # A daemon without the route answers it 404 (not the route's JSON): reads
    # and writes go through the Connect calls, the upload's body is never
    # sent to the route, and the transport does not ask again.
    data = os.urandom(2 << 20)

    def answer(req: Any) -> bytes:
        if req.path.startswith("/sbx/v1/files"):
            return plain("404 Not Found", b"404 page not found\n", "text/plain")
        if req.path.endswith("/ReadFile"):
            return response(chunked(frame(P.encode({"data": data}, P.FILE_CHUNK)), end_stream()))
        return response(chunked(frame(P.encode({"bytesWritten": len(data)}, P.WRITE_FILE_RESPONSE)), end_stream()))

    d = fake(answer)
    t = Transport(d.addr)
    f = sbx.Files(t, "sb-1")
    assert run_bounded(lambda: f.write("/w", data)) == len(data)
    assert not t.raw_files
    assert run_bounded(lambda: f.read("/w")) == data
    paths = [(r.method, r.path.split("?")[0]) for r in d.requests]
    assert paths == [
        ("GET", "/sbx/v1/files"),
        ("POST", "/sbx.v1.SandboxService/WriteFile"),
        ("POST", "/sbx.v1.SandboxService/ReadFile"),
    ], paths
