"""Observing: client.events() shows a sandbox's lifecycle and commands in
order; client.stats() its usage, with a history."""

from __future__ import annotations

import datetime as _dt
from typing import Callable

import pytest

import sbx


def test_events_replay_a_sandboxs_lifecycle(client: sbx.Client, make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    sb = make_sandbox()
    assert sb.run("echo hi").exit_code == 0
    sb.terminate()
    with client.events(sandboxes=[sb.id], since=_dt.timedelta(minutes=5), follow=False) as evs:
        got = [(e.type, e.reason) for e in evs]
    assert got == [
        ("created", "cold"), ("started", ""), ("exec_started", ""), ("exec_ended", ""), ("destroyed", "user"),
    ], got


def test_events_filters_by_type_and_follows(client: sbx.Client, make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    with client.events(types=["exec_ended"]) as evs:
        sb = make_sandbox()
        sb.run("exit 3")
        ev = next(evs)
        assert evs.live
        assert (ev.type, ev.sandbox_id, ev.exit_code, ev.detail) == ("exec_ended", sb.id, 3, "sh")


def test_events_rejects_unknown_types(client: sbx.Client) -> None:
    with pytest.raises(ValueError, match="unknown event types"):
        client.events(types=["exploded"])
    with pytest.raises(ValueError, match="follow=False needs since"):
        client.events(follow=False)


def test_stats_current_and_history(client: sbx.Client, make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    sb = make_sandbox(memory="64M")
    sb.run("true")
    # The sampler reads every sandbox each interval (5 s by default).
    import time

    deadline = time.time() + 30
    while True:
        got = client.stats(sb.id, history=True)
        if got and got[0].current is not None or time.time() > deadline:
            break
        time.sleep(0.2)
    assert len(got) == 1, got
    u = got[0]
    assert (u.sandbox_id, u.state, u.memory_limit, u.execs) == (sb.id, "running", 64 << 20, 1)
    assert u.current is not None and u.current.memory > 0 and u.current.pids > 0
    assert len(u.history) >= 1 and u.history[-1] == u.current
    with pytest.raises(sbx.NotFoundError):
        client.stats("sb-0000000000ff")


def test_aio_events_and_stats(client: sbx.Client, make_sandbox: Callable[..., sbx.Sandbox]) -> None:
    import asyncio

    from sbx.aio import AsyncClient

    sb = make_sandbox()

    async def main() -> None:
        ac = AsyncClient(client=client)
        got = []
        async for ev in ac.events(sandboxes=[sb.id], since=_dt.timedelta(minutes=5)):
            got.append(ev.type)
            if ev.type == "started":
                break
        assert got == ["created", "started"]
        assert isinstance(await ac.stats(history=True), list)

    asyncio.run(main())
