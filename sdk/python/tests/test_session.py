"""Stateful shell sessions (Sandbox.session)."""

from __future__ import annotations

import time

import pytest

import sbx


def test_session_state_and_output(shared_sandbox: sbx.Sandbox) -> None:
    with shared_sandbox.session(env={"GREETING": "hi"}) as sh:
        r = sh.exec("echo out; echo err >&2; false")
        assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 1, False)
        assert sh.exec("mkdir -p /tmp/pysess && cd /tmp/pysess && export V=42").ok
        assert sh.exec("pwd; echo $V $GREETING").stdout == "/tmp/pysess\n42 hi\n"
        assert [s.id for s in shared_sandbox.list_sessions()] == [sh.id]
    assert shared_sandbox.list_sessions() == []
    with pytest.raises(sbx.NotFoundError):
        sh.exec("true")


def test_session_timeout_and_close(shared_sandbox: sbx.Sandbox) -> None:
    sh = shared_sandbox.session()
    try:
        assert sh.exec("sleep 4343 &").ok
        start = time.monotonic()
        r = sh.exec("sleep 100", timeout=1)
        assert r.timed_out and r.exit_code == 130, r
        assert time.monotonic() - start < 20
        r = sh.exec("echo alive; jobs | grep -c 'sleep 4343'")
        assert r.stdout == "alive\n1\n", r
    finally:
        sh.close()
    check = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 4343' || true"
    deadline = time.monotonic() + 10
    while True:
        left = shared_sandbox.run(check).stdout.strip()
        if left == "0" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == "0"
