"""The asyncio flavour: same operations as coroutines, async iteration of output."""

from __future__ import annotations

import asyncio
import io
import os
import time

import pytest

import sbx
from conftest import LABEL, RUN_ID
from sbx.aio import AsyncClient, AsyncSandbox


def test_async_sandbox(client: sbx.Client) -> None:
    async def main() -> None:
        ac = AsyncClient(client=client)
        assert (await ac.version()).get("version")
        async with await AsyncSandbox.create(labels={LABEL: RUN_ID, "aio": "yes"}, memory="128M",
                                             client=ac) as sb:
            assert sb.state == "running"
            r = await sb.run("echo hi; exit 2")
            assert (r.stdout, r.exit_code) == ("hi\n", 2)
            with pytest.raises(sbx.CommandError):
                await sb.run("exit 1", raise_on_error=True)

            # Lines arrive while the command runs, without blocking the loop.
            start = time.monotonic()
            p = await sb.exec("sh", "-c", "echo one; sleep 1; echo two")
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.05)
                    ticks += 1

            t = asyncio.create_task(ticker())
            seen = []
            async for line in p.stdout:
                seen.append((line, time.monotonic() - start))
            t.cancel()
            assert [s[0] for s in seen] == ["one\n", "two\n"]
            assert seen[1][1] - seen[0][1] >= 0.8
            assert ticks >= 10  # the loop kept running meanwhile
            assert await p.wait() == 0

            # Several commands awaited concurrently.
            results = await asyncio.gather(*(sb.run(f"sleep 0.5; echo {i}") for i in range(3)))
            assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]

            p = await sb.exec("cat", stdin=b"piped")
            res = await p.result()
            assert res.stdout == "piped" and res.exit_code == 0

            await sb.files.write("/root/a.txt", "async data")
            assert await sb.files.read_text("/root/a.txt") == "async data"
            assert [f.name for f in await sb.files.list("/root")] == ["a.txt"]
            assert await sb.files.exists("/root/a.txt")
            # Bulk bytes (the binary codec) while the loop keeps running.
            blob = os.urandom((10 << 20) + 17)
            assert await sb.files.write("/root/blob", blob) == len(blob)
            sink = io.BytesIO()
            got, _ = await asyncio.gather(sb.files.read("/root/blob"), sb.files.download_file("/root/blob", sink))
            assert got == blob and sink.getvalue() == blob
            tar_bytes = await sb.files.download_tar("/root/blob")
            assert await sb.files.upload_tar("/root/t", tar_bytes) == {"files": 1, "bytes": len(blob)}
            assert await sb.files.read("/root/t/blob") == blob
            await sb.files.remove("/root/blob")
            await sb.files.remove("/root/t", recursive=True)

            found = await AsyncSandbox.list(labels={"aio": "yes", LABEL: RUN_ID}, client=ac)
            assert [s.id for s in found] == [sb.id]
            assert (await AsyncSandbox.from_id(sb.id, client=ac)).id == sb.id
            assert (await sb.stats()).pids >= 1
            await sb.stop()
            assert (await sb.refresh()).state == "stopped"
            await sb.start()
            assert sb.state == "running"
            sid = sb.id
        with pytest.raises(sbx.NotFoundError):
            await ac.get(sid)
        with pytest.raises(sbx.NotFoundError):
            await AsyncSandbox.from_id("sb-nope", client=client)

    asyncio.run(main())
