"""A small protobuf (proto3 wire format) encoder and decoder for the few
messages that carry bulk bytes: file, tar, codebase and image streams.

Standard library only. Messages are described by schemas (below, with the
field numbers of ``api/proto/sbx/v1``) and handled in the same dict form the
JSON protocol uses (camelCase keys), so that the code around a call does not
care which codec carried it. Decoding skips fields a schema does not know (a
newer daemon's additions), refuses a known field sent with the wrong wire
type, and raises :class:`ProtoError` naming what was wrong for truncated or
malformed input. ``bytes`` fields decode to memoryviews of the input (no
copy): they are only valid as long as the caller keeps the input unchanged.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

__all__ = [
    "ProtoError",
    "Schema",
    "encode",
    "decode",
    "encode_varint",
    "decode_varint",
    "iter_fields",
]

Buffer = Union[bytes, bytearray, memoryview]

# Wire types.
VARINT = 0
I64 = 1
LEN = 2
SGROUP = 3
EGROUP = 4
I32 = 5

# Field kinds of a schema.
STRING = "string"
BYTES = "bytes"
INT64 = "int64"
INT32 = "int32"
UINT32 = "uint32"
BOOL = "bool"
MESSAGE = "message"
MAP_STRING_STRING = "map<string,string>"

_WIRE = {
    STRING: LEN,
    BYTES: LEN,
    INT64: VARINT,
    INT32: VARINT,
    UINT32: VARINT,
    BOOL: VARINT,
    MESSAGE: LEN,
    MAP_STRING_STRING: LEN,
}

_MAX_DEPTH = 32


class ProtoError(ValueError):
    """Malformed protobuf input (truncated, a bad varint, a wrong wire type)."""


class Field:
    """One field of a schema: its number, its JSON (camelCase) name, its
    kind, whether it is repeated and, for messages, the message's schema."""

    __slots__ = ("number", "name", "kind", "repeated", "schema")

    def __init__(self, number: int, name: str, kind: str, repeated: bool = False,
                 schema: Optional["Schema"] = None) -> None:
        if kind not in _WIRE:
            raise ValueError(f"field {name}: unknown kind {kind!r}")
        if kind == MESSAGE and schema is None:
            raise ValueError(f"field {name}: a message field needs a schema")
        self.number = number
        self.name = name
        self.kind = kind
        self.repeated = repeated
        self.schema = schema


class Schema:
    """The fields of one message type."""

    def __init__(self, name: str, *fields: Field) -> None:
        self.name = name
        self.by_number: Dict[int, Field] = {f.number: f for f in fields}
        self.by_name: Dict[str, Field] = {f.name: f for f in fields}
        if len(self.by_number) != len(fields) or len(self.by_name) != len(fields):
            raise ValueError(f"schema {name}: duplicate field number or name")


# -- varints ---------------------------------------------------------------


def encode_varint(n: int) -> bytes:
    """Encode a non-negative integer below 2**64 as a varint; negative
    integers are encoded as their 64-bit two's complement (as int32 and
    int64 fields are)."""
    if n < 0:
        n += 1 << 64
    if n < 0 or n >= 1 << 64:
        raise ValueError(f"varint out of range: {n}")
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(buf: Buffer, pos: int) -> Tuple[int, int]:
    """Decode the varint at ``buf[pos:]``; return it and the position after it."""
    n = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        if shift == 63 and b > 1:
            raise ProtoError("varint overflows 64 bits")
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint longer than 10 bytes")


# -- encoding --------------------------------------------------------------


def _tag(number: int, wire: int) -> bytes:
    return encode_varint(number << 3 | wire)


def _scalar(f: Field, v: Any) -> bytes:
    if f.kind == STRING:
        b = str(v).encode("utf-8")
        return _tag(f.number, LEN) + encode_varint(len(b)) + b
    if f.kind == BYTES:
        b = bytes(v)
        return _tag(f.number, LEN) + encode_varint(len(b)) + b
    if f.kind == BOOL:
        return _tag(f.number, VARINT) + (b"\x01" if v else b"\x00")
    n = int(v)  # int64 arrives as a string in the JSON form
    if f.kind == UINT32 and not 0 <= n < 1 << 32:
        raise ValueError(f"field {f.name}: {n} is not a uint32")
    if f.kind == INT32 and not -(1 << 31) <= n < 1 << 31:
        raise ValueError(f"field {f.name}: {n} is not an int32")
    if f.kind == INT64 and not -(1 << 63) <= n < 1 << 63:
        raise ValueError(f"field {f.name}: {n} is not an int64")
    return _tag(f.number, VARINT) + encode_varint(n)


def _default(f: Field, v: Any) -> bool:
    """Whether ``v`` is the proto3 default of ``f`` (left out when encoding)."""
    if v is None:
        return True
    if f.kind in (STRING, BYTES):
        return len(v) == 0
    if f.kind == BOOL:
        return not v
    return int(v) == 0


def encode(obj: Mapping[str, Any], schema: Schema) -> bytes:
    """Encode ``obj`` (the message in its JSON form: camelCase keys, int64
    as int or decimal string, bytes as bytes) with ``schema``. Fields at
    their default value are left out, as proto3 does; a key the schema does
    not know is an error (it would otherwise be dropped silently)."""
    out = bytearray()
    for name, v in obj.items():
        f = schema.by_name.get(name)
        if f is None:
            raise ValueError(f"{schema.name} has no field {name!r}")
        if f.kind == MAP_STRING_STRING:
            for k, val in dict(v or {}).items():
                entry = _scalar(_MAP_KEY, k) + _scalar(_MAP_VALUE, val)
                out += _tag(f.number, LEN) + encode_varint(len(entry)) + entry
            continue
        values = list(v or ()) if f.repeated else [v]
        for item in values:
            if f.kind == MESSAGE:
                assert f.schema is not None
                body = encode(item or {}, f.schema)
                out += _tag(f.number, LEN) + encode_varint(len(body)) + body
            elif f.repeated or not _default(f, item):
                out += _scalar(f, item)
    return bytes(out)


_MAP_KEY = Field(1, "key", STRING)
_MAP_VALUE = Field(2, "value", STRING)


# -- decoding --------------------------------------------------------------


def _skip_group(buf: memoryview, pos: int, number: int, depth: int) -> int:
    """Skip a (deprecated) group's fields up to its end tag."""
    if depth > _MAX_DEPTH:
        raise ProtoError("groups nested too deeply")
    while True:
        tag, pos = decode_varint(buf, pos)
        wire = tag & 7
        if wire == EGROUP:
            if tag >> 3 != number:
                raise ProtoError(f"group {number} closed by end tag of {tag >> 3}")
            return pos
        _, pos = _read_value(buf, pos, tag >> 3, wire, depth + 1)


def _read_value(buf: memoryview, pos: int, number: int, wire: int, depth: int) -> Tuple[Any, int]:
    if wire == VARINT:
        return decode_varint(buf, pos)
    if wire == LEN:
        n, pos = decode_varint(buf, pos)
        if n > len(buf) - pos:
            raise ProtoError(f"field {number}: length {n} runs past the end of the message ({len(buf) - pos} bytes left)")
        return buf[pos : pos + n], pos + n
    if wire == I64:
        if pos + 8 > len(buf):
            raise ProtoError(f"field {number}: truncated fixed64")
        return int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
    if wire == I32:
        if pos + 4 > len(buf):
            raise ProtoError(f"field {number}: truncated fixed32")
        return int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
    if wire == SGROUP:
        return None, _skip_group(buf, pos, number, depth)
    raise ProtoError(f"field {number}: invalid wire type {wire}")


def iter_fields(buf: Buffer) -> Iterator[Tuple[int, int, Any]]:
    """Yield ``(field number, wire type, value)`` for every field of one
    message: an int for varint and fixed fields, a memoryview for
    length-delimited ones, ``None`` for skipped groups."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    pos = 0
    end = len(mv)
    while pos < end:
        tag, pos = decode_varint(mv, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtoError("field number 0")
        if wire == EGROUP:
            raise ProtoError(f"end of group {number} without its start")
        value, pos = _read_value(mv, pos, number, wire, 0)
        yield number, wire, value


def _signed(n: int, bits: int) -> int:
    n &= (1 << 64) - 1
    if n >= 1 << 63:
        n -= 1 << 64
    if bits == 32:
        # int32 fields are sign-extended to 64 bits; keep the low 32.
        n &= (1 << 32) - 1
        if n >= 1 << 31:
            n -= 1 << 32
    return n


def _utf8(v: memoryview, schema: Schema, f: Field) -> str:
    try:
        return str(v, "utf-8")
    except UnicodeDecodeError as e:
        raise ProtoError(f"{schema.name}.{f.name}: invalid UTF-8: {e}") from None


def decode(buf: Buffer, schema: Schema, _depth: int = 0) -> Dict[str, Any]:
    """Decode one message into its JSON form (camelCase keys; int64 as int;
    bytes as memoryviews of ``buf``). Fields absent from the input are
    absent from the dict."""
    if _depth > _MAX_DEPTH:
        raise ProtoError(f"{schema.name}: messages nested too deeply")
    out: Dict[str, Any] = {}
    for number, wire, v in iter_fields(buf):
        f = schema.by_number.get(number)
        if f is None:
            continue  # a field this client does not know: skipped
        if wire != _WIRE[f.kind]:
            raise ProtoError(f"{schema.name}.{f.name}: wire type {wire}, want {_WIRE[f.kind]}")
        if f.kind == STRING:
            val: Any = _utf8(v, schema, f)
        elif f.kind == BYTES:
            val = v
        elif f.kind == BOOL:
            val = v != 0
        elif f.kind == INT64:
            val = _signed(v, 64)
        elif f.kind == INT32:
            val = _signed(v, 32)
        elif f.kind == UINT32:
            val = v & 0xFFFFFFFF
        elif f.kind == MAP_STRING_STRING:
            entry = decode(v, _MAP_ENTRY, _depth + 1)
            out.setdefault(f.name, {})[entry.get("key", "")] = entry.get("value", "")
            continue
        else:
            assert f.schema is not None
            val = decode(v, f.schema, _depth + 1)
        if f.repeated:
            out.setdefault(f.name, []).append(val)
        else:
            out[f.name] = val  # the last one wins, as in protobuf
    return out


_MAP_ENTRY = Schema("MapEntry", _MAP_KEY, _MAP_VALUE)


# -- the messages of the bulk data streams (api/proto/sbx/v1) ----------------

# files.proto
FILE_CHUNK = Schema("FileChunk", Field(1, "data", BYTES))
READ_FILE_REQUEST = Schema(
    "ReadFileRequest",
    Field(1, "sandbox", STRING),
    Field(2, "path", STRING),
    Field(3, "offset", INT64),
    Field(4, "length", INT64),
)
WRITE_FILE_HEADER = Schema(
    "WriteFileHeader",
    Field(1, "sandbox", STRING),
    Field(2, "path", STRING),
    Field(3, "mode", UINT32),
    Field(4, "append", BOOL),
    Field(5, "makeParents", BOOL),
)
WRITE_FILE_REQUEST = Schema(
    "WriteFileRequest", Field(1, "header", MESSAGE, schema=WRITE_FILE_HEADER), Field(2, "data", BYTES)
)
WRITE_FILE_RESPONSE = Schema("WriteFileResponse", Field(1, "bytesWritten", INT64))
UPLOAD_TAR_HEADER = Schema("UploadTarHeader", Field(1, "sandbox", STRING), Field(2, "path", STRING))
UPLOAD_TAR_REQUEST = Schema(
    "UploadTarRequest", Field(1, "header", MESSAGE, schema=UPLOAD_TAR_HEADER), Field(2, "data", BYTES)
)
UPLOAD_TAR_RESPONSE = Schema("UploadTarResponse", Field(1, "files", INT64), Field(2, "bytes", INT64))
DOWNLOAD_TAR_REQUEST = Schema("DownloadTarRequest", Field(1, "sandbox", STRING), Field(2, "path", STRING))

# codebase.proto
SKIPPED_FILE = Schema(
    "SkippedFile", Field(1, "path", STRING), Field(2, "sizeBytes", INT64), Field(3, "reason", STRING)
)
CODEBASE = Schema(
    "Codebase",
    Field(1, "id", STRING),
    Field(2, "name", STRING),
    Field(3, "revision", INT64),
    Field(4, "fileCount", INT64),
    Field(5, "sizeBytes", INT64),
    Field(6, "createdAtMs", INT64),
    Field(7, "updatedAtMs", INT64),
    Field(8, "sandboxes", STRING, repeated=True),
    Field(9, "skipped", MESSAGE, repeated=True, schema=SKIPPED_FILE),
)
CREATE_CODEBASE_HEADER = Schema(
    "CreateCodebaseHeader",
    Field(1, "name", STRING),
    Field(2, "maxFileBytes", INT64),
    Field(3, "skipped", MESSAGE, repeated=True, schema=SKIPPED_FILE),
)
CREATE_CODEBASE_REQUEST = Schema(
    "CreateCodebaseRequest",
    Field(1, "header", MESSAGE, schema=CREATE_CODEBASE_HEADER),
    Field(2, "data", BYTES),
)
CREATE_CODEBASE_RESPONSE = Schema(
    "CreateCodebaseResponse",
    Field(1, "codebase", MESSAGE, schema=CODEBASE),
    Field(2, "skipped", MESSAGE, repeated=True, schema=SKIPPED_FILE),
)
DOWNLOAD_CODEBASE_REQUEST = Schema("DownloadCodebaseRequest", Field(1, "codebase", STRING))

# images.proto
IMAGE_CONFIG = Schema(
    "ImageConfig",
    Field(1, "env", STRING, repeated=True),
    Field(2, "workdir", STRING),
    Field(3, "user", STRING),
    Field(4, "entrypoint", STRING, repeated=True),
    Field(5, "cmd", STRING, repeated=True),
    Field(6, "labels", MAP_STRING_STRING),
)
IMAGE_INFO = Schema(
    "ImageInfo",
    Field(1, "ref", STRING),
    Field(2, "digest", STRING),
    Field(3, "sizeBytes", INT64),
    Field(4, "layers", INT32),
    Field(5, "createdAtMs", INT64),
    Field(6, "config", MESSAGE, schema=IMAGE_CONFIG),
)
ARCHIVE_NAMES = Schema(
    "ArchiveNames", Field(1, "tags", STRING, repeated=True), Field(2, "rejected", STRING, repeated=True)
)
IMPORT_IMAGE_HEADER = Schema(
    "ImportImageHeader",
    Field(1, "tag", STRING),
    Field(2, "useArchiveTags", BOOL),
    Field(3, "replaceArchiveTags", BOOL),
)
IMPORT_IMAGE_REQUEST = Schema(
    "ImportImageRequest", Field(1, "header", MESSAGE, schema=IMPORT_IMAGE_HEADER), Field(2, "data", BYTES)
)
IMPORT_IMAGE_RESPONSE = Schema(
    "ImportImageResponse",
    Field(1, "images", MESSAGE, repeated=True, schema=IMAGE_INFO),
    Field(2, "archiveNames", MESSAGE, repeated=True, schema=ARCHIVE_NAMES),
)
EXPORT_IMAGE_REQUEST = Schema("ExportImageRequest", Field(1, "ref", STRING))


def chunk_data(payload: Buffer) -> memoryview:
    """The ``data`` of one FileChunk message (a view of ``payload``). The
    hot path of every download: no dict, unknown fields skipped."""
    mv = payload if isinstance(payload, memoryview) else memoryview(payload)
    # The daemon sends exactly one field; a fast path for it.
    if len(mv) >= 2 and mv[0] == 0x0A:
        n, pos = decode_varint(mv, 1)
        if pos + n == len(mv):
            return mv[pos:]
    data: memoryview = mv[:0]
    for number, wire, v in iter_fields(mv):
        if number == 1:
            if wire != LEN:
                raise ProtoError(f"FileChunk.data: wire type {wire}, want {LEN}")
            data = v
    return data


def data_prefix(number: int, n: int) -> bytes:
    """The tag and length of a ``bytes`` field ``number`` of ``n`` bytes:
    what goes before the data of an upload message."""
    return _tag(number, LEN) + encode_varint(n)
