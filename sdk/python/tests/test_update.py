"""Changing a live sandbox: lifetime, labels, limits, auto-resume; exit reasons."""

from __future__ import annotations

import asyncio
import time

import pytest

import sbx
from conftest import LABEL, RUN_ID
from sbx.aio import AsyncClient, AsyncSandbox


def test_set_timeout_moves_the_deadline(make_sandbox) -> None:
    sb = make_sandbox(timeout=60)
    before = time.time()
    sb.set_timeout(600)
    assert sb.info.timeout == 600
    assert sb.info.expires_at is not None and sb.info.expires_at.timestamp() >= before + 600 - 1
    sb.set_timeout(1)
    deadline = time.time() + 15
    while True:
        try:
            sb.refresh()
        except sbx.NotFoundError as e:
            assert "lifetime timeout" in str(e)
            break
        assert time.time() < deadline, "a sandbox shortened to 1 s was not destroyed"
        time.sleep(0.1)


def test_labels(client: sbx.Client, make_sandbox) -> None:
    sb = make_sandbox(labels={"tier": "x"})
    sb.update(labels={"team": "py"}, remove_labels=["tier"])
    assert sb.labels == {LABEL: RUN_ID, "team": "py"}
    assert [s.id for s in sbx.Sandbox.list({"team": "py", LABEL: RUN_ID}, client=client)] == [sb.id]
    sb.set_tags({LABEL: RUN_ID, "only": "this"})
    assert sb.refresh().labels == {LABEL: RUN_ID, "only": "this"}
    with pytest.raises(sbx.InvalidArgumentError, match="both set and removed"):
        sb.update(labels={"k": "v"}, remove_labels=["k"])


def test_limits(make_sandbox) -> None:
    sb = make_sandbox(memory="128M", pids=128)
    sb.update(memory="256M", cpu=1, pids=300)
    r = sb.info.resources
    assert (r.memory_bytes, r.cpu, r.pids) == (256 << 20, 1.0, 300)
    with pytest.raises(sbx.InvalidArgumentError, match="maximum"):
        sb.update(memory="1T")
    with pytest.raises(ValueError):
        sb.update(cpu=0)


def test_auto_resume(make_sandbox) -> None:
    sb = make_sandbox(auto_resume=True)
    assert sb.info.auto_resume
    sb.stop()
    assert sb.run("echo back").stdout == "back\n"
    assert sb.refresh().state == "running"


def test_exit_reasons(make_sandbox) -> None:
    sb = make_sandbox(memory="64M", disk="16M", pids=64)
    r = sb.run(["python3", "-c", "b = bytearray(256 << 20)"])
    assert (r.exit_code, r.oom_killed) == (137, True)
    r = sb.run("kill -9 $$")
    assert (r.exit_code, r.oom_killed) == (137, False)
    forker = (
        "import os, signal, sys, time\n"
        "kids = []\n"
        "try:\n"
        "    while True:\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        kids.append(pid)\n"
        "except OSError:\n"
        "    pass\n"
        "for k in kids:\n"
        "    os.kill(k, signal.SIGKILL)\n"
        "    os.waitpid(k, 0)\n"
        "sys.exit(3)\n"
    )
    r = sb.run(["python3", "-c", forker])
    assert (r.exit_code, r.pids_limit_hit) == (3, True)
    assert not sb.run("exit 1").pids_limit_hit


def test_async_update(client: sbx.Client) -> None:
    async def main() -> None:
        ac = AsyncClient(client=client)
        async with await AsyncSandbox.create(labels={LABEL: RUN_ID}, client=ac) as sb:
            await sb.set_timeout(300)
            assert sb.info.timeout == 300
            await sb.set_labels({LABEL: RUN_ID, "aio": "yes"})
            await sb.update(auto_resume=True)
            assert sb.labels == {LABEL: RUN_ID, "aio": "yes"} and sb.info.auto_resume

    asyncio.run(main())
