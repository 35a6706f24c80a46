"""The bulk data streams (connect+proto) against a scripted fake daemon: what
the SDK sends, and how it takes well-formed, hostile and truncated answers.
No real daemon needed."""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import threading
from typing import Any, Callable, Dict, List, Optional

import pytest

import sbx
from sbx import _proto as P
from sbx._transport import Transport

# How long any call may take here before the test calls it a hang.
HANG = 20.0


def frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def end_stream(obj: Optional[Dict[str, Any]] = None) -> bytes:
    return frame(json.dumps(obj or {}).encode(), flags=2)


def chunked(*parts: bytes) -> bytes:
    """A chunked HTTP/1.1 body of ``parts`` (one HTTP chunk each), ended."""
    return b"".join(b"%X\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


def response(body: bytes, content_type: str = "application/connect+proto") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type.encode()
        + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body
    )


class Request:
    def __init__(self, head: bytes, body: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.method, self.path, _ = lines[0].split(" ", 2)
        self.headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if line)}
        self.body = body

    def messages(self) -> List[bytes]:
        """The request's messages (gzipped ones decompressed)."""
        return [m for _, m in self.frames()]

    def frames(self) -> List[Any]:
        out, pos = [], 0
        while pos < len(self.body):
            flags, n = struct.unpack_from(">BI", self.body, pos)
            assert flags in (0, 1), f"request message flags {flags}, want 0 or 1"
            m = self.body[pos + 5 : pos + 5 + n]
            if flags:
                assert self.headers.get("connect-content-encoding") == "gzip", "a gzipped message in an identity stream"
                m = gzip.decompress(m)
            out.append((flags, m))
            pos += 5 + n
        return out


class FakeDaemon:
    """Serves one scripted answer per connection: ``answer(request, sock)``
    writes what it wants (``respond_early`` answers before reading the
    request body, then drains it)."""

    def __init__(self, answer: Callable[[Request], bytes], respond_early: bool = False) -> None:
        self.answer = answer
        self.respond_early = respond_early
        self.requests: List[Request] = []
        self.errors: List[BaseException] = []
        self.ln = socket.socket()
        self.ln.bind(("127.0.0.1", 0))
        self.ln.listen(8)
        self.addr = "127.0.0.1:%d" % self.ln.getsockname()[1]
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.ln.accept()
            except OSError:
                return
            try:
                self._one(c)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
            finally:
                c.close()

    def _one(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = f.readline()
            if not line:
                return
            head += line
        req = Request(head[:-4], b"")
        if self.respond_early:
            c.sendall(self.answer(req))
        body = b""
        if req.headers.get("transfer-encoding") == "chunked":
            while True:
                line = f.readline()
                if not line:
                    return  # the client gave up mid-body
                n = int(line.strip(), 16)
                if n == 0:
                    f.readline()
                    break
                body += f.read(n)
                f.readline()
        else:
            body = f.read(int(req.headers.get("content-length", "0")))
        req.body = body
        self.requests.append(req)
        if not self.respond_early:
            out = self.answer(req)
            if isinstance(out, (bytes, bytearray)):
                c.sendall(out)
            else:  # an iterable of parts: a long answer made as it goes
                try:
                    for part in out:
                        c.sendall(part)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up

    def close(self) -> None:
        self.ln.close()


@pytest.fixture
def fake() -> Any:
    made: List[FakeDaemon] = []

    def make(answer: Callable[[Request], bytes], **kw: Any) -> FakeDaemon:
        d = FakeDaemon(answer, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
        assert not d.errors, f"fake daemon failed: {d.errors!r}"


def run_bounded(f: Callable[[], Any]) -> Any:
    """Run f in a thread; fail the test if it has not finished within HANG s."""
    box: Dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = f()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG)
    assert not t.is_alive(), f"the call hung for {HANG}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def files(d: FakeDaemon, compress: bool = False) -> sbx.Files:
    """Files over the Connect calls (the fake daemon has no raw file route,
    which test_raw_* cover)."""
    t = Transport(d.addr, file_compression=compress)
    t.raw_files = False
    return sbx.Files(t, "sb-1")


def test_read_request_and_split_answer(fake: Any) -> None:
    # The daemon's answer split at awkward HTTP chunk boundaries (a header
    # byte by byte, a message across chunks), with unknown fields in a
    # FileChunk, an empty chunk and trailing metadata.
    data = os.urandom(300_000)
    m1 = P.encode({"data": data[:100_000]}, P.FILE_CHUNK)
    m2 = b"\xf8\x07\x01" + P.encode({"data": data[100_000:]}, P.FILE_CHUNK) + b"\xea\x07\x01x"
    stream = frame(m1) + frame(b"") + frame(m2) + end_stream({"metadata": {"k": ["v"]}})
    parts = [stream[i : i + 1] for i in range(5)] + [stream[5:70_000], stream[70_000:250_001], stream[250_001:]]
    d = fake(lambda req: response(chunked(*parts)))
    got = run_bounded(lambda: files(d).read("/x", offset=7, length=1 << 33))
    assert got == data, f"read {len(got)} bytes, want the {len(data)} sent"
    (req,) = d.requests
    assert req.path == "/sbx.v1.SandboxService/ReadFile"
    assert req.headers["content-type"] == "application/connect+proto"
    assert "connect-accept-encoding" not in req.headers, "a data stream must not offer compression"
    (msg,) = req.messages()
    want = {"sandbox": "sb-1", "path": "/x", "offset": 7, "length": 1 << 33}
    assert P.decode(msg, P.READ_FILE_REQUEST) == want


@pytest.mark.parametrize(
    "body,code,msg",
    [
        # A message header promising 100 bytes, then 10 and the end.
        (chunked(struct.pack(">BI", 0, 100) + b"x" * 10), "unavailable", "cut off mid-message (10 of 100 bytes)"),
        (chunked(b"\x00\x00\x00"), "unavailable", "cut off in a message header (3 of 5 bytes)"),
        (chunked(frame(P.encode({"data": b"ok"}, P.FILE_CHUNK))), "unavailable", "without an end-of-stream message"),
        (chunked(frame(b"\x0a\x05ab") + end_stream()), "internal", "invalid message from the daemon"),
        (chunked(frame(b"\x08\x01") + end_stream()), "internal", "FileChunk.data: wire type 0"),
        (chunked(struct.pack(">BI", 0, 1 << 31)), "internal", "too large"),
        (chunked(frame(b"x", flags=1) + end_stream()), "internal", "compressed message without an encoding"),
        (chunked(frame(b"{not json", flags=2)), "internal", "invalid end-of-stream message"),
        (
            chunked(end_stream({"error": {"code": "not_found", "message": "read /x: no such file"}})),
            "not_found",
            "read /x: no such file",
        ),
        (
            chunked(frame(P.encode({"data": b"abc"}, P.FILE_CHUNK))
                    + end_stream({"error": {"code": "resource_exhausted", "message": "quota"}})),
            "resource_exhausted",
            "quota",
        ),
        # The connection dropped inside an HTTP chunk.
        (b"400\r\n" + struct.pack(">BI", 0, 100) + b"x" * 10, "unavailable", "reading from the sbx daemon"),
    ],
)
def test_hostile_or_truncated_answers(fake: Any, body: bytes, code: str, msg: str) -> None:
    d = fake(lambda req: response(body))
    for call in (lambda: files(d).read("/x"), lambda: files(d).download_file("/x", _Sink()),
                 lambda: list(files(d).iter_download_tar("/x"))):
        with pytest.raises(sbx.SbxError) as ei:
            run_bounded(call)
        assert ei.value.code == code, f"code {ei.value.code!r} ({ei.value}), want {code!r}"
        assert msg in str(ei.value), f"error {str(ei.value)!r} does not say {msg!r}"


class _Sink:
    def __init__(self) -> None:
        self.n = 0

    def write(self, b: Any) -> int:
        self.n += len(b)
        return len(b)


def test_download_memory_is_bounded(fake: Any) -> None:
    # 256 MiB streamed to a file object in a fresh interpreter: its peak RSS
    # stays far below the file's size (one message in flight, not the file).
    import subprocess
    import sys

    msg = frame(P.encode({"data": os.urandom(256 << 10)}, P.FILE_CHUNK))
    count = 1024

    def answer(req: Request) -> Any:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+proto\r\nTransfer-Encoding: chunked\r\n\r\n"
        yield head
        for _ in range(count):
            yield b"%X\r\n" % len(msg) + msg + b"\r\n"
        yield chunked(end_stream())

    d = fake(answer)
    code = (
        "import resource, sys, sbx\n"
        "from sbx._transport import Transport\n"
        "class Sink:\n"
        "    n = 0\n"
        "    def write(self, b):\n"
        "        self.n += len(b)\n"
        "        return len(b)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "s = Sink()\n"
        "t = Transport(sys.argv[1])\n"
        "t.raw_files = False\n"
        "n = sbx.Files(t, 'sb-1').download_file('/big', s)\n"
        "print(n, s.n, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    sdk = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, d.addr], capture_output=True, text=True, timeout=HANG * 3,
                         env=dict(os.environ, PYTHONPATH=sdk))
    assert out.returncode == 0, out.stderr
    n, seen, before_kib, peak_kib = map(int, out.stdout.split())
    want = count * (256 << 10)
    assert n == seen == want, f"downloaded {n} (wrote {seen}) bytes, want {want}"
    grew = (peak_kib - before_kib) << 10
    assert grew < 16 << 20, f"peak RSS grew by {grew >> 20} MiB downloading {want >> 20} MiB, want < 16 MiB"


def test_download_to_short_writing_file(fake: Any) -> None:
    # A raw file may write less than it is given: the rest is written too.
    data = os.urandom(700_000)
    body = chunked(frame(P.encode({"data": data[:400_000]}, P.FILE_CHUNK)),
                   frame(P.encode({"data": data[400_000:]}, P.FILE_CHUNK)), end_stream())
    d = fake(lambda req: response(body))

    class Short:
        def __init__(self) -> None:
            self.got = bytearray()

        def write(self, b: Any) -> int:
            k = min(len(b), 4099)
            self.got += b[:k]
            return k

    dest = Short()
    assert run_bounded(lambda: files(d).download_file("/x", dest)) == len(data)
    assert bytes(dest.got) == data


def test_http_error_status(fake: Any) -> None:
    body = json.dumps({"code": "unauthenticated", "message": "no token"}).encode()
    d = fake(lambda req: b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
             b"Connection: close\r\n\r\n%s" % (len(body), body))
    with pytest.raises(sbx.SbxError) as ei:
        run_bounded(lambda: files(d).read("/x"))
    assert (ei.value.code, "no token" in str(ei.value)) == ("unauthenticated", True), str(ei.value)


def write_answer(req: Request) -> bytes:
    # A newer daemon's response: an unknown field beside bytesWritten.
    n = sum(len(P.decode(m, P.WRITE_FILE_REQUEST).get("data", b"")) for m in req.messages()[1:])
    resp = b"\xf8\x07\x2a" + P.encode({"bytesWritten": n}, P.WRITE_FILE_RESPONSE)
    return response(chunked(frame(resp), end_stream()))


@pytest.mark.parametrize("kind", ["bytes", "memoryview", "file", "read-only", "str", "text-file"])
def test_write_sends_header_then_1mib_messages(fake: Any, tmp_path: Any, kind: str) -> None:
    data = os.urandom((3 << 20) + 12345)
    src: Any = data
    if kind == "memoryview":
        src = memoryview(bytearray(data))
    elif kind == "file":
        p = tmp_path / "src"
        p.write_bytes(data)
        src = open(p, "rb")
    elif kind == "read-only":

        class ReadOnly:  # a file-like object without readinto
            def __init__(self) -> None:
                self.pos = 0

            def read(self, n: int) -> bytes:
                b = data[self.pos : self.pos + n]
                self.pos += len(b)
                return b

        src = ReadOnly()
    elif kind == "str":
        src = "héllo wörld " * 100_000
        data = src.encode()
    elif kind == "text-file":
        # read(1 MiB) of it gives 1 Mi characters: 2 MiB of UTF-8.
        import io

        text = "é" * (3 << 20)
        src = io.StringIO(text)
        data = text.encode()
    d = fake(write_answer)
    try:
        got = run_bounded(lambda: files(d).write("/dir/f", src, 0o600, append=True))
    finally:
        if kind == "file":
            src.close()
    assert got == len(data), f"bytesWritten {got}, want {len(data)}"
    (req,) = d.requests
    assert (req.path, req.headers["content-type"]) == ("/sbx.v1.SandboxService/WriteFile", "application/connect+proto")
    msgs = [P.decode(m, P.WRITE_FILE_REQUEST) for m in req.messages()]
    assert msgs[0] == {"header": {"sandbox": "sb-1", "path": "/dir/f", "mode": 0o600, "append": True,
                                  "makeParents": True}}
    chunks = [bytes(m["data"]) for m in msgs[1:]]
    assert b"".join(chunks) == data, "the uploaded bytes differ from the source"
    assert max(len(c) for c in chunks) == 1 << 20, f"largest message {max(len(c) for c in chunks)}, want 1 MiB"
    assert all(set(m) == {"data"} for m in msgs[1:]), "a data message carries more than data"


def test_write_empty_sends_only_the_header(fake: Any) -> None:
    d = fake(write_answer)
    assert run_bounded(lambda: files(d).write("/e", b"")) == 0
    assert len(d.requests[0].messages()) == 1


@pytest.mark.parametrize("early", [False, True])
def test_write_error_keeps_its_code(fake: Any, early: bool) -> None:
    # The daemon refuses (before or after reading the body): the error's code
    # and message reach the caller, not a broken pipe.
    err = {"error": {"code": "permission_denied", "message": "write /etc/x: denied by rule"}}
    d = fake(lambda req: response(chunked(end_stream(err))), respond_early=early)
    with pytest.raises(sbx.PermissionDeniedError, match="denied by rule"):
        run_bounded(lambda: files(d).write("/etc/x", os.urandom(4 << 20)))


def test_write_truncated_response(fake: Any) -> None:
    d = fake(lambda req: response(chunked(frame(b"\x08"), end_stream())))
    with pytest.raises(sbx.SbxError) as ei:
        run_bounded(lambda: files(d).write("/x", b"abc"))
    assert ei.value.code == "internal" and "truncated varint" in str(ei.value), str(ei.value)


def test_upload_source_error_propagates(fake: Any) -> None:
    class Broken:  # a local file failing mid-upload: its error, not the daemon's
        def __init__(self) -> None:
            self.calls = 0

        def read(self, n: int) -> bytes:
            raise AssertionError("read() called though readinto() exists")

        def readinto(self, b: Any) -> int:
            self.calls += 1
            if self.calls > 2:
                raise OSError("disk on fire")
            b[:] = bytes(len(b))
            return len(b)

    d = fake(write_answer)
    with pytest.raises(OSError, match="disk on fire"):
        run_bounded(lambda: files(d).write("/x", Broken()))  # type: ignore[arg-type]


def gz_response(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+proto\r\nConnect-Content-Encoding: gzip\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body
    )


def test_file_compression_is_asked_for_and_taken(fake: Any) -> None:
    # Asked for: the request says gzip and is gzipped, the answer's gzipped
    # messages (the end-of-stream one too) are decompressed.
    data = b"compressible line\n" * 50_000
    body = chunked(frame(gzip.compress(P.encode({"data": data}, P.FILE_CHUNK)), flags=1),
                   frame(P.encode({"data": b"tail"}, P.FILE_CHUNK)),
                   frame(gzip.compress(json.dumps({}).encode()), flags=3))
    d = fake(lambda req: gz_response(body))
    assert run_bounded(lambda: files(d, compress=True).read("/x")) == data + b"tail"
    (req,) = d.requests
    assert (req.headers.get("connect-content-encoding"), req.headers.get("connect-accept-encoding")) == ("gzip", "gzip")
    assert [f for f, _ in req.frames()] == [1], "the request message is not gzipped"
    assert P.decode(req.messages()[0], P.READ_FILE_REQUEST) == {"sandbox": "sb-1", "path": "/x"}


def test_file_compression_upload(fake: Any) -> None:
    data = os.urandom(1 << 20) + b"z" * (3 << 20)
    d = fake(write_answer)
    assert run_bounded(lambda: files(d, compress=True).write("/x", data)) == len(data)
    (req,) = d.requests
    flags = [f for f, _ in req.frames()]
    assert flags == [0, 1, 1, 1, 1], f"message flags {flags}, want the header plain and the data gzipped"
    assert b"".join(bytes(P.decode(m, P.WRITE_FILE_REQUEST)["data"]) for m in req.messages()[1:]) == data
    assert req.headers.get("connect-content-encoding") == "gzip"
    # Not asked for: nothing says gzip.
    d2 = fake(write_answer)
    run_bounded(lambda: files(d2).write("/x", b"abc"))
    assert "connect-content-encoding" not in d2.requests[0].headers
    assert "connect-accept-encoding" not in d2.requests[0].headers


@pytest.mark.parametrize(
    "payload,msg",
    [
        # 65 MiB of zeros in 65 KiB: more than a message may be.
        (gzip.compress(b"\x0a\x80\x80\x90\x20" + bytes(65 << 20)), "decompresses to more than 67108864 bytes"),
        (gzip.compress(P.encode({"data": b"abc" * 1000}, P.FILE_CHUNK))[:-30], "cut off"),
        (b"not gzip at all", "invalid gzip"),
    ],
)
def test_hostile_compressed_answers(fake: Any, payload: bytes, msg: str) -> None:
    d = fake(lambda req: gz_response(chunked(frame(payload, flags=1), end_stream())))
    with pytest.raises(sbx.SbxError) as ei:
        run_bounded(lambda: files(d, compress=True).read("/x"))
    assert ei.value.code == "internal" and msg in str(ei.value), str(ei.value)
