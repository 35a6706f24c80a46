"""A minimal Connect-protocol client over HTTP/1.1 using only the standard library.

Unary calls are ``POST /<service>/<method>`` with ``Content-Type:
application/json``; errors come back as a non-200 status with a JSON body
``{"code": ..., "message": ...}``.

Streaming calls use *enveloped* messages: one flag byte, a 4-byte big-endian
length and the payload. Flag ``0x01`` marks a compressed payload, ``0x02``
the end-of-stream envelope, whose payload is always JSON (in both codecs)
and carries an optional ``error`` and ``metadata``. Most streams use
``application/connect+json``; the ones that carry bulk bytes (file, tar,
codebase and image data) use ``application/connect+proto`` with the small
codec of :mod:`._proto`, so that their bytes go as they are instead of as
base64 inside JSON: :meth:`Transport.data_stream` reads them into one
reused buffer, and :meth:`Transport.upload_stream` writes them from one
(1 MiB messages, as the Go SDK sends). Bidirectional streaming needs HTTP/2
and is not supported here.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import io
import json
import os
import socket
import ssl
import stat
import struct
import threading
import urllib.parse
import zlib
from typing import IO, Any, Callable, Dict, Iterator, Optional, Union

from . import _proto
from .errors import SbxConnectionError, SbxError, UnknownError, error_from_code

__all__ = ["Transport", "ServerStream", "ChunkStream", "b64encode", "b64decode", "DEFAULT_ADDR", "UPLOAD_CHUNK"]

#: Where the daemon listens unless told otherwise.
DEFAULT_ADDR = "127.0.0.1:7777"

_FLAG_COMPRESSED = 0x01
_FLAG_END_STREAM = 0x02
_MAX_MESSAGE = 256 << 20  # refuse absurd envelope lengths (corrupt stream)
#: Largest message of a bulk data stream accepted from the daemon (it sends
#: 256 KiB ones); the bound of what one download holds in memory.
_MAX_DATA_MESSAGE = 64 << 20
#: Bytes of file data per uploaded message (the Go SDK's chunk size).
UPLOAD_CHUNK = 1 << 20
#: Room before the data in the upload buffer for the HTTP chunk line, the
#: envelope and the field's tag and length.
_PREFIX_ROOM = 32

#: What an upload reads its bytes from.
Source = Union[bytes, bytearray, memoryview, IO[bytes]]

# Connect's mapping of HTTP status to code, for error bodies that are not JSON.
_HTTP_TO_CODE = {
    400: "internal",
    401: "unauthenticated",
    403: "permission_denied",
    404: "unimplemented",
    408: "deadline_exceeded",
    429: "unavailable",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}


def b64encode(data: bytes) -> str:
    """Encode bytes the way protojson does (standard alphabet, padded)."""
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    """Decode a protojson bytes field (standard or URL-safe, padded or not)."""
    if not text:
        return b""
    pad = "=" * (-len(text) % 4)
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(text + pad)
    return base64.b64decode(text + pad)


def envelope(message: Dict[str, Any], flags: int = 0) -> bytes:
    """Frame one JSON message as a Connect envelope."""
    payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return struct.pack(">BI", flags, len(payload)) + payload


def _http_chunk(data: bytes) -> bytes:
    """One chunk of a chunked HTTP/1.1 body."""
    return b"%X\r\n" % len(data) + data + b"\r\n"


def _gzip(data: Union[bytes, memoryview]) -> bytes:
    """gzip at the default level (as Go's compress/gzip; not Python's 9)."""
    c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _gunzip(data: Union[bytes, memoryview], limit: int) -> bytes:
    """Decompress one gzipped message of at most ``limit`` bytes; a larger
    one (a decompression bomb) or a cut or corrupt one raises ValueError."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise ValueError(f"invalid gzip: {e}") from None
    if len(out) > limit:
        raise ValueError(f"it decompresses to more than {limit} bytes")
    if not d.eof:
        raise ValueError("invalid gzip: the compressed message is cut off")
    return out


class _SendError(Exception):
    """Sending to the daemon failed (the socket's error is the cause); what
    reading the upload's source raises passes through as it is."""


def _send_data(
    sock: socket.socket, first: bytes, source: Source, data_field: int, chunk_size: int, gz: bool = False
) -> None:
    """Write a chunked request body: the enveloped message ``first``, then
    the bytes of ``source`` as messages of one ``bytes`` field
    (``data_field``) of up to ``chunk_size`` bytes, each sent from one
    reused buffer holding the HTTP chunk line, the envelope, the field's tag
    and length, the data and the chunk's end. With ``gz`` the data messages
    are gzipped (and so no longer sent from the buffer)."""

    def send(b: Union[bytes, memoryview]) -> None:
        try:
            sock.sendall(b)
        except OSError as e:
            raise _SendError(str(e)) from e

    send(_http_chunk(struct.pack(">BI", 0, len(first)) + first))
    buf = bytearray(_PREFIX_ROOM + chunk_size + 2)
    mv = memoryview(buf)
    body = mv[_PREFIX_ROOM : _PREFIX_ROOM + chunk_size]
    if isinstance(source, str):
        source = source.encode("utf-8")
    if isinstance(source, (bytes, bytearray, memoryview)):
        src = memoryview(source).cast("B")
        pos = 0

        def fill() -> int:
            nonlocal pos
            n = min(chunk_size, len(src) - pos)
            body[:n] = src[pos : pos + n]
            pos += n
            return n

    elif hasattr(source, "readinto"):
        readinto = source.readinto  # type: ignore[union-attr]

        def fill() -> int:
            n = readinto(body)
            if n is None:
                raise BlockingIOError("the upload source has no data ready (non-blocking file)")
            return n

    elif hasattr(source, "read"):
        # A file without readinto (a text file gives str: sent as UTF-8,
        # which may be longer than asked for: the rest goes next time).
        read = source.read
        pending = memoryview(b"")

        def fill() -> int:
            nonlocal pending
            if not pending:
                chunk = read(chunk_size)
                if isinstance(chunk, str):
                    chunk = chunk.encode("utf-8")
                if not chunk:
                    return 0
                pending = memoryview(chunk).cast("B")
            n = min(chunk_size, len(pending))
            body[:n] = pending[:n]
            pending = pending[n:]
            return n

    else:
        raise TypeError(f"cannot upload {type(source).__name__}: want bytes, str or a binary file")
    while True:
        n = fill()
        if n == 0:
            break
        field = _proto.data_prefix(data_field, n)
        if gz:
            start = _PREFIX_ROOM - len(field)
            buf[start:_PREFIX_ROOM] = field
            packed = _gzip(mv[start : _PREFIX_ROOM + n])
            send(_http_chunk(struct.pack(">BI", _FLAG_COMPRESSED, len(packed)) + packed))
            continue
        msg_len = len(field) + n
        prefix = b"%X\r\n" % (5 + msg_len) + struct.pack(">BI", 0, msg_len) + field
        start = _PREFIX_ROOM - len(prefix)
        buf[start:_PREFIX_ROOM] = prefix
        end = _PREFIX_ROOM + n
        buf[end : end + 2] = b"\r\n"
        send(mv[start : end + 2])
    send(b"0\r\n\r\n")


def _error_from_json(obj: Any, op: str, status: int = 0) -> SbxError:
    if isinstance(obj, dict) and isinstance(obj.get("code"), str):
        return error_from_code(
            obj["code"], str(obj.get("message", "")), op=op, details=obj.get("details") or None
        )
    code = _HTTP_TO_CODE.get(status, "unknown")
    return error_from_code(code, f"HTTP status {status}", op=op)


class Transport:
    """Connect-protocol calls to one daemon. Safe for concurrent use: every
    call opens its own HTTP connection.

    Args:
        addr: ``"host:port"`` or an ``http://``/``https://`` URL (a path is
            used as a prefix). ``None`` means ``$SBX_ADDR``, else
            ``127.0.0.1:7777``.
        timeout: default deadline in seconds of unary calls (``None``: none).
        connect_timeout: seconds to wait for the TCP connection.
        token: the daemon's API token, sent as ``Authorization: Bearer``.
            ``None`` means ``$SBX_TOKEN`` (unset or empty: no token).
        cacert: PEM file of the CA(s) to trust for an ``https://`` daemon
            besides the system's (``sbx serve --tls-cert`` with a private CA).
            ``None`` means ``$SBX_CACERT`` (unset: the system's roots only).
        file_compression: gzip the messages of the data calls made with
            ``compress=True`` (the file transfers), which also lets the
            daemon gzip its answers to them.
    """

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        connect_timeout: float = 10.0,
        token: Optional[str] = None,
        cacert: Optional[str] = None,
        file_compression: bool = False,
    ) -> None:
        self.file_compression = file_compression
        self.token = os.environ.get("SBX_TOKEN", "") if token is None else token
        cacert = os.environ.get("SBX_CACERT") or None if cacert is None else cacert
        self._ssl = ssl.create_default_context()
        if cacert:
            # A file that cannot be read raises here: never trust less than asked.
            self._ssl.load_verify_locations(cafile=cacert)
        addr = addr or os.environ.get("SBX_ADDR") or DEFAULT_ADDR
        self.addr = addr
        url = addr if "://" in addr else "http://" + addr
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https"):
            raise ValueError(f"unsupported scheme in sbx address {addr!r}")
        if not parsed.hostname:
            raise ValueError(f"no host in sbx address {addr!r}")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._prefix = parsed.path.rstrip("/")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        #: File data goes over the daemon's raw file route (cleared when
        #: the daemon turns out to have none).
        self.raw_files = not file_compression
        self._raw_probed = False

    # -- connections -------------------------------------------------------

    def _connect(self, read_timeout: Optional[float]) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.connect_timeout, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise SbxConnectionError(f"cannot reach the sbx daemon at {self.addr}: {e}") from e
        assert conn.sock is not None
        conn.sock.settimeout(read_timeout)
        return conn

    def _path(self, service: str, method: str) -> str:
        return f"{self._prefix}/{service}/{method}"

    @property
    def base_url(self) -> str:
        """The daemon's base URL (scheme, host, port and prefix)."""
        scheme = "https" if self._https else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self._port}{self._prefix}"

    def auth_headers(self) -> Dict[str, str]:
        """The headers carrying the API token (none without one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _headers(self, content_type: str, timeout: Optional[float], gzip_stream: bool = False) -> Dict[str, str]:
        h = {
            "Content-Type": content_type,
            "Connect-Protocol-Version": "1",
            "User-Agent": "sbx-python/0.1",
            **self.auth_headers(),
        }
        if timeout is not None:
            h["Connect-Timeout-Ms"] = str(max(1, int(timeout * 1000)))
        if gzip_stream:
            # Our messages may be gzipped, and so may the daemon's answers
            # (it sends data streams uncompressed to anyone who does not
            # compress their own request).
            h["Connect-Content-Encoding"] = "gzip"
            h["Connect-Accept-Encoding"] = "gzip"
        return h

    # -- unary -------------------------------------------------------------

    def unary(
        self,
        service: str,
        method: str,
        request: Dict[str, Any],
        *,
        op: str = "",
        timeout: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Make a unary call and return the decoded JSON response."""
        timeout = self.timeout if timeout is None else timeout
        body = json.dumps(request, separators=(",", ":")).encode("utf-8")
        conn = self._connect(None if timeout is None else timeout + 5)
        try:
            try:
                conn.request(
                    "POST",
                    self._path(service, method),
                    body=body,
                    headers=self._headers("application/json", timeout),
                )
                resp = conn.getresponse()
                data = resp.read()
            except socket.timeout as e:
                raise error_from_code("deadline_exceeded", f"no answer within {timeout}s", op=op) from e
            except (OSError, http.client.HTTPException) as e:
                raise SbxConnectionError(f"talking to the sbx daemon at {self.addr}: {e}", op=op) from e
            if resp.getheader("Content-Encoding", "identity").lower() == "gzip":
                data = gzip.decompress(data)
            try:
                obj = json.loads(data.decode("utf-8")) if data else {}
            except ValueError:
                obj = None
            if resp.status != 200:
                raise _error_from_json(obj, op, resp.status)
            if not isinstance(obj, dict):
                raise UnknownError("the daemon's answer is not a JSON object", op=op)
            return obj
        finally:
            conn.close()

    # -- server streaming ----------------------------------------------------

    def server_stream(
        self, service: str, method: str, request: Dict[str, Any], *, op: str = ""
    ) -> "ServerStream":
        """Start a server-streaming call; iterate the result for its messages."""
        conn = self._connect(None)
        try:
            conn.request(
                "POST",
                self._path(service, method),
                body=envelope(request),
                headers=self._headers("application/connect+json", None),
            )
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise SbxConnectionError(f"talking to the sbx daemon at {self.addr}: {e}", op=op) from e
        return ServerStream(conn, resp, op)

    # -- bulk data (application/connect+proto) ---------------------------------

    def data_stream(
        self,
        service: str,
        method: str,
        request: Dict[str, Any],
        schema: "_proto.Schema",
        *,
        op: str = "",
        compress: bool = False,
    ) -> ChunkStream:
        """Start a server stream of FileChunk messages (file, tar, codebase
        or image bytes). ``request`` (in its JSON form) is encoded with
        ``schema``. Iterate the result for the data as memoryviews. With
        ``compress`` and the transport's ``file_compression``, the request
        is gzipped and the daemon may gzip its answer."""
        body = _proto.encode(request, schema)
        gz = compress and self.file_compression
        flags = 0
        if gz:
            body, flags = _gzip(body), _FLAG_COMPRESSED
        conn = self._connect(None)
        try:
            conn.request(
                "POST",
                self._path(service, method),
                body=struct.pack(">BI", flags, len(body)) + body,
                headers=self._headers("application/connect+proto", None, gzip_stream=gz),
            )
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise SbxConnectionError(f"talking to the sbx daemon at {self.addr}: {e}", op=op) from e
        return ChunkStream(conn, resp, op, max_message=_MAX_DATA_MESSAGE)

    def upload_stream(
        self,
        service: str,
        method: str,
        header: Dict[str, Any],
        source: Source,
        request_schema: "_proto.Schema",
        response_schema: "_proto.Schema",
        *,
        op: str = "",
        chunk_size: int = UPLOAD_CHUNK,
        compress: bool = False,
    ) -> Dict[str, Any]:
        """Make a client-streaming call whose first message is ``{"header":
        header}`` and whose others carry the bytes of ``source`` (bytes, str
        as UTF-8, or a binary file read from where it is) in the request's
        ``data`` field, ``chunk_size`` bytes a message; return the single
        response message in its JSON form. With ``compress`` and the
        transport's ``file_compression``, the data messages are gzipped."""
        gz = compress and self.file_compression
        first = _proto.encode({"header": header}, request_schema)
        data_field = request_schema.by_name["data"].number
        conn = self._connect(None)
        stream: Optional[ServerStream] = None
        try:
            send_error: Optional[BaseException] = None
            try:
                conn.putrequest("POST", self._path(service, method), skip_accept_encoding=True)
                for k, v in self._headers("application/connect+proto", None, gzip_stream=gz).items():
                    conn.putheader(k, v)
                conn.putheader("Transfer-Encoding", "chunked")
                conn.endheaders()
            except (OSError, http.client.HTTPException) as e:
                raise SbxConnectionError(f"talking to the sbx daemon at {self.addr}: {e}", op=op) from e
            assert conn.sock is not None
            try:
                # What reading the source raises passes through as it is.
                _send_data(conn.sock, first, source, data_field, chunk_size, gz)
            except _SendError as e:
                cause = e.__cause__
                if not isinstance(cause, (BrokenPipeError, ConnectionResetError)):
                    raise SbxConnectionError(f"talking to the sbx daemon at {self.addr}: {cause}", op=op) from cause
                # The daemon may have answered (with an error) before reading
                # everything: try to read that answer below.
                send_error = cause
            try:
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise SbxConnectionError(
                    f"talking to the sbx daemon at {self.addr}: {send_error or e}", op=op
                ) from e
            stream = ServerStream(conn, resp, op, decode=lambda p: _proto.decode(p, response_schema))
            result: Optional[Dict[str, Any]] = None
            for msg in stream:
                if result is None:
                    result = msg
            if result is None:
                raise UnknownError("the daemon sent no response message", op=op)
            return result
        finally:
            if stream is not None:
                stream.close()
            conn.close()


class ServerStream(Iterator[Dict[str, Any]]):
    """The messages of a streaming response, decoded from Connect envelopes.

    Iterating yields each message as a dict; the end-of-stream envelope's error,
    if any, is raised as an :class:`~sbx.SbxError`. :meth:`close` (from any
    thread) aborts the call, which tells the daemon the client is gone.

    Each message is read into one buffer reused for the next (grown to the
    largest message seen, at most ``max_message`` bytes).
    """

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        op: str,
        *,
        decode: Optional[Callable[[memoryview], Dict[str, Any]]] = None,
        max_message: int = _MAX_MESSAGE,
    ) -> None:
        self._conn = conn
        self._resp = resp
        self._op = op
        self._decode_msg = decode
        self._max = max_message
        self._done = False
        self._closed = False
        self._lock = threading.Lock()
        self._head = bytearray(5)
        self._buf = bytearray(0)
        self.trailers: Dict[str, Any] = {}
        self._compressed = resp.getheader("Connect-Content-Encoding", "identity").lower() == "gzip"
        if resp.status != 200:
            data = b""
            try:
                data = resp.read()
                obj = json.loads(data.decode("utf-8")) if data else None
            except (ValueError, OSError, http.client.HTTPException):
                obj = None
            self.close()
            self._done = True
            self._pending_error: Optional[SbxError] = _error_from_json(obj, op, resp.status)
        else:
            self._pending_error = None

    def _readinto(self, mv: memoryview) -> int:
        """Fill ``mv`` from the response; fewer bytes only at its end."""
        got = 0
        while got < len(mv):
            n = self._resp.readinto(mv[got:])
            if not n:
                break
            got += n
        return got

    def __iter__(self) -> "ServerStream":
        return self

    def _next_payload(self) -> Optional[Union[bytes, memoryview]]:
        """The payload of the next message (a view of the reused buffer,
        valid until the next call), or ``None`` after the end-of-stream
        message, whose error is raised. Everything wrong with the stream is
        raised as an :class:`~sbx.SbxError` and ends it."""
        if self._pending_error is not None:
            err, self._pending_error = self._pending_error, None
            raise err
        if self._done:
            return None
        try:
            head = memoryview(self._head)
            got = self._readinto(head)
            if got < 5:
                self._finish()
                if self._closed_by_us():
                    raise error_from_code("canceled", "the call was canceled", op=self._op)
                if got:
                    raise error_from_code(
                        "unavailable", f"the stream was cut off in a message header ({got} of 5 bytes)", op=self._op
                    )
                raise error_from_code(
                    "unavailable", "the stream ended without an end-of-stream message", op=self._op
                )
            flags, length = struct.unpack(">BI", self._head)
            if length > self._max:
                self._finish()
                raise error_from_code(
                    "internal", f"message of {length} bytes is too large (at most {self._max})", op=self._op
                )
            if len(self._buf) < length:
                self._buf = bytearray(length)
            payload: Union[bytes, memoryview] = memoryview(self._buf)[:length]
            got = self._readinto(payload)  # type: ignore[arg-type]
            if got < length:
                self._finish()
                raise error_from_code(
                    "unavailable", f"the stream was cut off mid-message ({got} of {length} bytes)", op=self._op
                )
        except (OSError, http.client.HTTPException, ValueError) as e:
            self._finish()
            if self._closed_by_us():
                raise error_from_code("canceled", "the call was canceled", op=self._op) from e
            raise SbxConnectionError(f"reading from the sbx daemon: {e}", op=self._op) from e
        if flags & _FLAG_COMPRESSED:
            if not self._compressed:
                self._finish()
                raise error_from_code("internal", "compressed message without an encoding", op=self._op)
            try:
                payload = _gunzip(payload, self._max)
            except ValueError as e:
                self._finish()
                raise error_from_code("internal", f"invalid compressed message: {e}", op=self._op) from e
        if flags & _FLAG_END_STREAM:
            # The end-of-stream message is JSON whatever the stream's codec.
            self._finish()
            try:
                obj = json.loads(bytes(payload).decode("utf-8")) if payload else {}
            except ValueError as e:
                raise error_from_code("internal", f"invalid end-of-stream message: {e}", op=self._op) from e
            if isinstance(obj, dict):
                self.trailers = obj.get("metadata") or {}
                if obj.get("error"):
                    raise _error_from_json(obj["error"], self._op)
            return None
        return payload

    def __next__(self) -> Dict[str, Any]:
        payload = self._next_payload()
        if payload is None:
            raise StopIteration
        if self._decode_msg is not None:
            try:
                return self._decode_msg(memoryview(payload))
            except _proto.ProtoError as e:
                self._finish()
                raise error_from_code("internal", f"invalid message from the daemon: {e}", op=self._op) from e
        try:
            obj = json.loads(bytes(payload).decode("utf-8")) if payload else {}
        except ValueError as e:
            self._finish()
            raise error_from_code("internal", f"invalid JSON message: {e}", op=self._op) from e
        if not isinstance(obj, dict):
            raise error_from_code("internal", "message is not a JSON object", op=self._op)
        return obj

    def _closed_by_us(self) -> bool:
        with self._lock:
            return self._closed

    def _finish(self) -> None:
        self._done = True
        try:
            self._conn.close()
        except OSError:
            pass

    def close(self) -> None:
        """Abort the call (safe to call from another thread, and more than once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._done = True
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._conn.close()
        except OSError:
            pass

    def __enter__(self) -> "ServerStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChunkStream(ServerStream):
    """The ``data`` of the FileChunk messages of a bulk data stream
    (``application/connect+proto``). Iterating yields memoryviews of one
    reused buffer: each is valid only until the next one is asked for (copy
    it with ``bytes()`` to keep it). Empty chunks are skipped."""

    def __next__(self) -> memoryview:  # type: ignore[override]
        while True:
            payload = self._next_payload()
            if payload is None:
                raise StopIteration
            try:
                data = _proto.chunk_data(payload)
            except _proto.ProtoError as e:
                self._finish()
                raise error_from_code("internal", f"invalid message from the daemon: {e}", op=self._op) from e
            if len(data):
                return data

    def __iter__(self) -> "ChunkStream":
        return self

    def __enter__(self) -> "ChunkStream":
        return self

    def copy_to(self, dest: Any) -> int:
        """Write every chunk to the binary file ``dest`` and return the byte
        count. As with any ``write()`` of the io module, ``dest`` must not
        keep the memoryview it is given; short writes (raw files) are
        continued."""
        n = 0
        for data in self:
            n += len(data)
            while data:
                k = dest.write(data)
                if k is None or k >= len(data):
                    break
                data = data[k:]
        return n


# -- the raw file route --------------------------------------------------------
#
# The daemon's ``/sbx/v1/files`` (see "The raw file route" in
# docs/ARCHITECTURE.md): a file's bytes as a plain HTTP/1.1 body, which the
# daemon splices to and from the sandbox's agent instead of carrying them in
# WriteFile/ReadFile messages. ``Files`` uses it unless the transport
# compresses file data, and stops using it once a daemon answers that it has
# no such route (404 without the route's JSON).

FILES_PATH = "/sbx/v1/files"

#: The smallest upload sent over the raw route: the daemon closes each such
#: connection after its answer, so small files stay on the Connect calls.
RAW_UPLOAD_MIN = 1 << 20


class NoRawRoute(Exception):
    """The daemon predates the raw file route."""


class RawStream(ChunkStream):
    """A file's bytes from the raw file route. Iterating yields memoryviews
    of one reused 1 MiB buffer, each valid until the next is asked for; a
    body cut short of its Content-Length raises ``unavailable``."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, op: str) -> None:
        super().__init__(conn, resp, op)
        self._rbuf = bytearray(1 << 20)

    def __next__(self) -> memoryview:  # type: ignore[override]
        if self._done:
            raise StopIteration
        try:
            n = self._resp.readinto(self._rbuf)
        except (OSError, http.client.HTTPException, ValueError) as e:
            self._finish()
            if self._closed_by_us():
                raise error_from_code("canceled", "the call was canceled", op=self._op) from e
            raise error_from_code("unavailable", f"the download was cut off: {e}", op=self._op) from e
        if not n:
            left = self._resp.length
            self._finish()
            if left:
                raise error_from_code(
                    "unavailable",
                    f"the download was cut off {left} bytes short (the sandbox stopped, or the file changed?)",
                    op=self._op,
                )
            raise StopIteration
        return memoryview(self._rbuf)[:n]


def _raw_error(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, op: str) -> Exception:
    """The error of a raw route answer that is not 200 (NoRawRoute for a
    daemon without the route)."""
    obj: Any = None
    try:
        data = resp.read(1 << 16)
        obj = json.loads(data.decode("utf-8")) if data else None
    except (ValueError, OSError, http.client.HTTPException):
        obj = None
    conn.close()
    if not (isinstance(obj, dict) and isinstance(obj.get("code"), str)) and resp.status == 404:
        return NoRawRoute()
    return _error_from_json(obj, op, resp.status)


def _raw_size(data: Any) -> Optional[int]:
    """How many bytes ``data`` has left to send, if known without reading it."""
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    if isinstance(data, memoryview):
        return data.nbytes
    fileno = getattr(data, "fileno", None)
    if fileno is None:
        return None
    try:
        st = os.fstat(fileno())
        pos = data.tell()
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(st.st_mode) or pos > st.st_size:
        return None
    return st.st_size - pos


def _raw_route(t: "Transport", query: Dict[str, Any]) -> str:
    return t._prefix + FILES_PATH + "?" + urllib.parse.urlencode(query)


def raw_read(t: "Transport", query: Dict[str, Any], op: str) -> RawStream:
    """GET a file over the raw route (raises NoRawRoute without one)."""
    conn = t._connect(None)
    try:
        conn.request("GET", _raw_route(t, query), headers={"User-Agent": "sbx-python/0.1", **t.auth_headers()})
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        raise SbxConnectionError(f"talking to the sbx daemon at {t.addr}: {e}", op=op) from e
    if resp.status != 200:
        raise _raw_error(conn, resp, op)
    return RawStream(conn, resp, op)


def _probe_raw(t: "Transport", op: str) -> None:
    """Ask once whether the daemon has the raw route (a GET without a path:
    the route answers 400 in its JSON, an older daemon 404), so that an
    upload is never sent to a daemon that would drop it unread."""
    if t._raw_probed:
        return
    try:
        raw_read(t, {}, op)
    except NoRawRoute:
        raise
    except SbxError:
        pass  # the route's own refusal: it is there
    t._raw_probed = True


def raw_write(t: "Transport", query: Dict[str, Any], data: Any, size: int, op: str) -> int:
    """PUT ``size`` bytes of ``data`` over the raw route and return the bytes
    written (raises NoRawRoute without one, having sent nothing). A regular
    file goes with sendfile(2), bytes in one send."""
    _probe_raw(t, op)
    conn = t._connect(None)
    try:
        try:
            conn.putrequest("PUT", _raw_route(t, query), skip_accept_encoding=True)
            conn.putheader("Content-Type", "application/octet-stream")
            conn.putheader("Content-Length", str(size))
            conn.putheader("User-Agent", "sbx-python/0.1")
            for k, v in t.auth_headers().items():
                conn.putheader(k, v)
            conn.endheaders()
            sock = conn.sock
            assert sock is not None
            if isinstance(data, (bytes, bytearray, memoryview)):
                sock.sendall(data)
            else:
                pos = data.tell()
                sent = sock.sendfile(data, offset=pos, count=size)
                if sent != size:
                    raise error_from_code("invalid_argument", f"the file ended after {sent} of {size} bytes", op=op)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon refused midway: its answer says why
        resp = conn.getresponse()
        if resp.status != 200:
            raise _raw_error(conn, resp, op)
        body = resp.read(1 << 16)
    except (OSError, http.client.HTTPException) as e:
        raise SbxConnectionError(f"talking to the sbx daemon at {t.addr}: {e}", op=op) from e
    finally:
        conn.close()
    try:
        return int(json.loads(body.decode("utf-8")).get("bytes_written", 0))
    except (ValueError, AttributeError) as e:
        raise error_from_code("internal", f"invalid answer from the daemon: {body[:200]!r}", op=op) from e
