"""Errors say what failed once: the SDK's op is left out when the daemon's
message already begins with it. Needs no daemon."""

from __future__ import annotations

import pytest

from sbx.errors import error_from_code


@pytest.mark.parametrize("op,message,want", [
    ("stat /x", "stat /x: no such file or directory", "stat /x: no such file or directory"),
    ("snapshot sandbox sb-1", "snapshot sandbox sb-1: tag: bad", "snapshot sandbox sb-1: tag: bad"),
    ("get sandbox x", 'sandbox "x": not found', 'get sandbox x: sandbox "x": not found'),
    ("stat /x", "stat /xy: gone", "stat /x: stat /xy: gone"),
    ("", "plain", "plain"),
])
def test_op_once(op: str, message: str, want: str) -> None:
    e = error_from_code("not_found", message, op=op)
    assert str(e) == want
    assert e.op == op and e.message == message
