"""The sandbox's own command: logs, stdout/stderr lines, wait, returncode,
a command that cannot start, the entrypoint opt-out."""

from __future__ import annotations

import threading
from typing import Callable, List

import pytest

import sbx


def test_logs_both_streams_and_wait(make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    sb = make_sandbox(command=["sh", "-c", "echo out1; echo err1 >&2; exit 4"])
    st = sb.wait(timeout=60)
    assert st.exit_code == 4
    assert sb.wait(timeout=60).exit_code == 4  # kept: a second wait gets it too
    assert sb.returncode == 4
    with sb.logs() as lg:
        got = lg.read()
    assert got == {"stdout": b"out1\n", "stderr": b"err1\n"}
    assert lg.exit is not None and lg.exit.exit_code == 4
    assert (lg.dropped_stdout, lg.dropped_stderr) == (0, 0)
    assert [c.text for c in sb.logs(tail=1)] in (["err1\n"], ["out1\n"])


def test_stdout_follows_while_the_command_prints(make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    sb = make_sandbox(command=["sh", "-c", "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"])
    assert sb.returncode is None  # still running
    lines = sb.stdout
    assert next(lines) == "first\n"
    # A second follower, closed early, does not stop the command.
    other = sb.logs(follow=True)
    assert next(other).data == b"first\n"
    other.close()
    errs: List[str] = []
    t = threading.Thread(target=lambda: errs.extend(sb.stderr))
    t.start()
    sb.files.write("/tmp/go", b"")
    assert lines.read() == "second\n"
    assert lines.exit is not None and lines.exit.exit_code == 0
    t.join(30)
    assert not t.is_alive() and errs == []


def test_flood_is_bounded_and_dropped_bytes_counted(make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    sb = make_sandbox(command=["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo END"])
    assert sb.wait(timeout=60).exit_code == 0
    lg = sb.logs()
    out = lg.read()["stdout"]
    assert len(out) == 1 << 20 and out.endswith(b"xEND\n")
    assert lg.dropped_stdout == 3000004 - (1 << 20)


def test_command_that_cannot_start_fails_the_create(client: sbx.Client, make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    with pytest.raises(sbx.FailedPreconditionError, match="no-such-binary-xyz"):
        make_sandbox(command=["no-such-binary-xyz"])


def test_no_command(make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    sb = make_sandbox(entrypoint=False)
    with pytest.raises(sbx.FailedPreconditionError, match="no command"):
        sb.wait(timeout=30)
    with pytest.raises(sbx.FailedPreconditionError):
        sb.logs().read()


def test_logs_arguments() -> None:
    from sbx.logs import logs_request

    assert logs_request("x", True, 12.5, 0) == {"sandbox": "x", "follow": True, "sinceUnixMs": "12500", "tail": 0}
    with pytest.raises(ValueError):
        logs_request("x", False, None, -1)
