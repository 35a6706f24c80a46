"""Background processes: stdin after the start, a pty, signals, reconnecting
from another client, limits on bad input."""

from __future__ import annotations

import time

import pytest

import sbx


def _wait_output(p: sbx.BackgroundProcess, want: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out, _ = p.output()
        if want in out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"output {out!r} has no {want!r} after {timeout}s")
        time.sleep(0.02)


def test_stdin_after_start_and_line_iteration(shared_sandbox: sbx.Sandbox) -> None:
    p = shared_sandbox.exec(
        "sh", "-c", 'echo ready; while read l; do echo "got $l"; done; echo bye >&2; exit 4',
        background=True, stdin=True,
    )
    assert isinstance(p, sbx.BackgroundProcess)
    assert p.pid > 1 and p.running and p.stdin_open and p.id.startswith("proc-")
    it = iter(p.stdout)
    assert next(it) == "ready\n"
    p.send_stdin("one\n")
    assert next(it) == "got one\n"
    p.send_stdin(b"two\n")
    assert next(it) == "got two\n"
    p.close_stdin()
    assert list(it) == []
    assert p.stderr.read() == "bye\n"
    assert p.wait() == 4
    assert p.exit_status is not None and p.exit_status.exit_code == 4
    with pytest.raises(sbx.FailedPreconditionError):
        p.send_stdin("late\n")


def test_connect_from_another_client_by_pid_and_tag(client: sbx.Client, shared_sandbox: sbx.Sandbox) -> None:
    p = shared_sandbox.processes.start("echo hi; exec sleep 600", tag="py-sleeper", env={"K": "v"}, workdir="/tmp")
    _wait_output(p, "hi\n")
    other = sbx.Client(client.addr, timeout=120).get(shared_sandbox.id)  # a second client
    by_pid = other.processes.connect(p.pid)
    by_tag = other.processes.connect("py-sleeper")
    assert by_pid.id == p.id == by_tag.id
    assert by_tag.env == {"K": "v"} and by_tag.workdir == "/tmp" and by_tag.tag == "py-sleeper"
    assert any(q.id == p.id and q.running for q in other.processes.list())
    assert by_tag.output() == ("hi\n", "")
    by_pid.signal("TERM")
    assert p.wait() == 143
    assert p.exit_status is not None and p.exit_status.signal == 15
    p.remove()
    assert all(q.id != p.id for q in shared_sandbox.processes.list())
    with pytest.raises(sbx.NotFoundError):
        shared_sandbox.processes.connect(p.id)


def test_pty(shared_sandbox: sbx.Sandbox) -> None:
    p = shared_sandbox.exec("sh -i", shell=True, background=True, pty=True)
    assert p.pty and p.stdin_open
    p.resize(33, 111)
    p.send_stdin("stty size; echo $((6*7))\n")
    out = _wait_output(p, "42")
    assert "33 111" in out
    p.send_stdin("exit 2\n")
    assert p.wait(timeout=30) == 2


def test_kill_and_context_manager(shared_sandbox: sbx.Sandbox) -> None:
    with shared_sandbox.exec("sleep", "600", background=True) as p:
        p.kill()
        assert p.wait() == 137
    # The block removed it.
    assert all(q.id != p.id for q in shared_sandbox.processes.list())


def test_bad_requests(shared_sandbox: sbx.Sandbox) -> None:
    with pytest.raises(ValueError):
        shared_sandbox.exec("sh", pty=True)  # pty without background
    with pytest.raises(sbx.InvalidArgumentError):
        shared_sandbox.processes.start("true", tag="123")  # reads as a pid
    with pytest.raises(sbx.FailedPreconditionError):
        shared_sandbox.processes.start(["/nonexistent/binary"])
    with pytest.raises(sbx.NotFoundError):
        shared_sandbox.processes.connect(999999)
    p = shared_sandbox.processes.start(["sleep", "600"])
    try:
        with pytest.raises(sbx.FailedPreconditionError):
            p.send_stdin("x")  # started without stdin
        with pytest.raises(ValueError):
            p.signal("NOPE")
    finally:
        p.remove()


def test_async_background_process(client: sbx.Client, shared_sandbox: sbx.Sandbox) -> None:
    import asyncio

    from sbx.aio import AsyncSandbox

    async def main() -> None:
        sb = AsyncSandbox(shared_sandbox)
        p = await sb.exec("sh", "-c", "echo ready; read l; echo \"got $l\"", background=True, stdin=True)
        lines = p.stdout.__aiter__()
        assert await lines.__anext__() == "ready\n"
        await p.send_stdin("x\n")
        assert await lines.__anext__() == "got x\n"
        assert await p.wait() == 0
        assert [q.pid for q in await sb.processes.list() if q.id == p.id] == [p.pid]
        await p.remove()

    asyncio.run(main())
