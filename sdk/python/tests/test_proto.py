"""The protobuf codec of the bulk data streams (sbx/_proto.py), without a daemon.

The golden encodings were made by the Go API's generated code
(``proto.MarshalOptions{Deterministic: true}.Marshal`` of the same messages),
so these tests pin the codec to what the daemon reads and writes.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest

from sbx import _proto as P

GOLDEN = {
    "WriteFileRequest": "0a160a0473622d3112072f746d702fc3a918ed0320012801",
    "ReadFileRequest": "0a0473622d3112022f611880808080802020ac02",
    "CreateCodebaseRequest": "0a320a02636210808080051a130a03626967108080c0051a07746f6f206269671a120a046669666f1a0a6e6f7420612066696c65",
    "CreateCodebaseResponse": "0a280a0463622d3112016e1801200328d2093080d0dfb4ab3338fbffffffffffffffff0142016142016212050a01781007",
    "ImportImageResponse": "0a4d0a03723a3112097368613235363a6162186320feffffffffffffffff012805322c0a03413d310a03423d3212022f771a0175220273682a022d632a017832060a016b12017632060a026b321200120a0a017412052262616422",
    "FileChunk": "0a04000102ff",
    "UploadTarResponse": "0802108080808020",
    "WriteFileResponse": "08cec2f105",
}

# The same messages in their JSON form (camelCase keys, int64 as int).
MESSAGES: Dict[str, Any] = {
    "WriteFileRequest": (
        P.WRITE_FILE_REQUEST,
        {"header": {"sandbox": "sb-1", "path": "/tmp/é", "mode": 0o755, "append": True, "makeParents": True}},
    ),
    "ReadFileRequest": (P.READ_FILE_REQUEST, {"sandbox": "sb-1", "path": "/a", "offset": 1 << 40, "length": 300}),
    "CreateCodebaseRequest": (
        P.CREATE_CODEBASE_REQUEST,
        {"header": {"name": "cb", "maxFileBytes": 10 << 20, "skipped": [
            {"path": "big", "sizeBytes": 11 << 20, "reason": "too big"},
            {"path": "fifo", "reason": "not a file"},
        ]}},
    ),
    "CreateCodebaseResponse": (
        P.CREATE_CODEBASE_RESPONSE,
        {
            "codebase": {"id": "cb-1", "name": "n", "revision": 1, "fileCount": 3, "sizeBytes": 1234,
                         "createdAtMs": 1764000000000, "updatedAtMs": -5, "sandboxes": ["a", "b"]},
            "skipped": [{"path": "x", "sizeBytes": 7}],
        },
    ),
    "ImportImageResponse": (
        P.IMPORT_IMAGE_RESPONSE,
        {
            "images": [{"ref": "r:1", "digest": "sha256:ab", "sizeBytes": 99, "layers": -2, "createdAtMs": 5,
                        "config": {"env": ["A=1", "B=2"], "workdir": "/w", "user": "u", "entrypoint": ["sh"],
                                   "cmd": ["-c", "x"], "labels": {"k": "v", "k2": ""}}}],
            "archiveNames": [{"tags": ["t"], "rejected": ['"bad"']}],
        },
    ),
    "FileChunk": (P.FILE_CHUNK, {"data": b"\x00\x01\x02\xff"}),
    "UploadTarResponse": (P.UPLOAD_TAR_RESPONSE, {"files": 2, "bytes": 1 << 33}),
    "WriteFileResponse": (P.WRITE_FILE_RESPONSE, {"bytesWritten": 12345678}),
}


def _plain(v: Any) -> Any:
    """memoryviews as bytes, for comparing decoded messages."""
    if isinstance(v, memoryview):
        return v.tobytes()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_encode_matches_go(name: str) -> None:
    schema, msg = MESSAGES[name]
    got = P.encode(msg, schema).hex()
    assert got == GOLDEN[name], f"encode({name}) = {got}, want {GOLDEN[name]}"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_decode_go_encoding(name: str) -> None:
    schema, want = MESSAGES[name]
    got = _plain(P.decode(bytes.fromhex(GOLDEN[name]), schema))
    assert got == want, f"decode({name}) = {got}, want {want}"


def test_encode_json_form() -> None:
    # int64 as a decimal string (the JSON form the SDK builds) encodes the same;
    # defaults are left out as proto3 does; a key the schema lacks is refused.
    a = P.encode({"sandbox": "s", "path": "p", "offset": str(1 << 40), "length": "0"}, P.READ_FILE_REQUEST)
    b = P.encode({"sandbox": "s", "path": "p", "offset": 1 << 40}, P.READ_FILE_REQUEST)
    assert a == b, f"got {a.hex()}, want {b.hex()}"
    assert P.encode({"sandbox": "", "path": "0", "offset": 0}, P.READ_FILE_REQUEST) == b"\x12\x010"
    with pytest.raises(ValueError, match="ReadFileRequest has no field 'bogus'"):
        P.encode({"bogus": 1}, P.READ_FILE_REQUEST)
    with pytest.raises(ValueError, match="not a uint32"):
        P.encode({"header": {"mode": -1}}, P.WRITE_FILE_REQUEST)


@pytest.mark.parametrize(
    "n,enc",
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        ((1 << 32) - 1, "ffffffff0f"),
        ((1 << 63) - 1, "ffffffffffffffff7f"),
        ((1 << 64) - 1, "ffffffffffffffffff01"),
        (-1, "ffffffffffffffffff01"),
    ],
)
def test_varint(n: int, enc: str) -> None:
    assert P.encode_varint(n).hex() == enc, f"encode_varint({n}) = {P.encode_varint(n).hex()}, want {enc}"
    got, pos = P.decode_varint(bytes.fromhex(enc), 0)
    assert (got, pos) == (n % (1 << 64), len(enc) // 2)


@pytest.mark.parametrize(
    "raw,err",
    [
        ("80", "truncated varint"),
        ("ffffffffffffffffff02", "overflows 64 bits"),
        ("ffffffffffffffffff8001", "overflows 64 bits"),
    ],
)
def test_bad_varint(raw: str, err: str) -> None:
    with pytest.raises(P.ProtoError, match=err):
        P.decode_varint(bytes.fromhex(raw), 0)
    with pytest.raises(ValueError, match="out of range"):
        P.encode_varint(1 << 64)


def _unknown_fields() -> bytes:
    """One unknown field of every wire type, including a group with a nested
    group and a length-delimited field holding garbage."""
    return (
        bytes.fromhex("f807") + P.encode_varint(1 << 62)  # 127, varint
        + bytes.fromhex("f107") + bytes(8)  # 126, fixed64
        + bytes.fromhex("ea07") + P.encode_varint(5) + b"\xff\xff\xff\xff\xff"  # 125, bytes (not a message)
        + bytes.fromhex("e507") + bytes(4)  # 124, fixed32
        + bytes.fromhex("db07") + bytes.fromhex("08 01 d307 1001 d407") + bytes.fromhex("dc07")  # 123, group in group
    )


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_unknown_fields_are_skipped(name: str) -> None:
    # A newer daemon may add fields: before, between and after known ones.
    schema, want = MESSAGES[name]
    golden = bytes.fromhex(GOLDEN[name])
    extra = _unknown_fields()
    # Split after the first known field (any field boundary works).
    cut = len(golden)
    for i in range(1, len(golden)):
        try:
            list(P.iter_fields(golden[:i]))
            list(P.iter_fields(golden[i:]))
        except P.ProtoError:
            continue
        cut = i
        break
    mixed = extra + golden[:cut] + extra + golden[cut:] + extra
    got = _plain(P.decode(mixed, schema))
    assert got == want, f"decode({name} with unknown fields) = {got}, want {want}"


def test_chunk_data() -> None:
    data = bytes(range(256)) * 10
    msg = P.encode({"data": data}, P.FILE_CHUNK)
    assert P.chunk_data(msg).tobytes() == data
    # Not the daemon's exact layout: unknown fields around it still work.
    assert P.chunk_data(_unknown_fields() + msg + _unknown_fields()).tobytes() == data
    assert P.chunk_data(b"").tobytes() == b""
    with pytest.raises(P.ProtoError, match="FileChunk.data: wire type 0"):
        P.chunk_data(b"\x08\x01")
    with pytest.raises(P.ProtoError, match="runs past the end"):
        P.chunk_data(msg[:-1])


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_truncated_input_is_an_error(name: str) -> None:
    # Every cut of a message either decodes (it ends on a field boundary) or
    # raises ProtoError naming the problem; never anything else.
    schema, _ = MESSAGES[name]
    golden = bytes.fromhex(GOLDEN[name])
    errors = 0
    for i in range(len(golden)):
        try:
            P.decode(golden[:i], schema)
        except P.ProtoError as e:
            assert str(e), "empty error message"
            errors += 1
    assert errors > 0, f"no cut of {name} was refused"
    # The last byte missing is always an error (it ends inside a field).
    with pytest.raises(P.ProtoError, match="truncated|runs past the end"):
        P.decode(golden[:-1], schema)


@pytest.mark.parametrize(
    "raw,err",
    [
        ("08", "truncated varint"),  # bytesWritten tag, no value
        ("0a", "truncated varint"),  # length-delimited tag, no length
        ("0a05ab", "length 5 runs past the end"),
        ("0d0000", "truncated fixed32"),
        ("090000", "truncated fixed64"),
        ("0e", "invalid wire type 6"),
        ("0f", "invalid wire type 7"),
        ("00", "field number 0"),
        ("0c", "end of group 1 without its start"),
        ("0b0801", "truncated varint"),  # group never closed
        ("0b14", "group 1 closed by end tag of 2"),
        ("0a0161", "WriteFileResponse.bytesWritten: wire type 2, want 0"),
    ],
)
def test_malformed_input(raw: str, err: str) -> None:
    with pytest.raises(P.ProtoError, match=err):
        P.decode(bytes.fromhex(raw), P.WRITE_FILE_RESPONSE)


def test_invalid_utf8_and_deep_nesting() -> None:
    with pytest.raises(P.ProtoError, match="UploadTarHeader.path: invalid UTF-8"):
        P.decode(b"\x12\x02\xff\xfe", P.UPLOAD_TAR_HEADER)
    deep = b""
    for _ in range(100):
        deep = b"\x1b" + deep + b"\x1c"  # groups of field 3 nested 100 deep
    with pytest.raises(P.ProtoError, match="nested too deeply"):
        P.decode(deep, P.WRITE_FILE_RESPONSE)
