"""The async iteration of blocking iterators (iter_read, logs, downloads)
stays a few items ahead of the reader and closes the iterator when the reader
stops. Needs no daemon."""

from __future__ import annotations

import asyncio
import threading
from typing import Iterator, List

import pytest

from sbx._aio import _Pump


def test_bounded_and_closed() -> None:
    produced: List[int] = []
    closed = threading.Event()

    def gen() -> Iterator[int]:
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    async def main() -> None:
        p = _Pump(gen(), window=4)
        got = []
        async for x in p:
            got.append(x)
            if len(got) == 3:
                break
        # The pump waits for room: the reader took 3, the window is 4.
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert len(produced) <= 3 + 4 + 1, len(produced)
        await p.aclose()
        for _ in range(250):
            if closed.is_set():
                break
            await asyncio.sleep(0.02)
        assert closed.is_set(), "the iterator was not closed after aclose"

    asyncio.run(main())


def test_all_items_and_errors() -> None:
    def bad() -> Iterator[int]:
        yield 1
        raise ValueError("boom")

    async def main() -> None:
        assert [x async for x in _Pump(iter(range(50)), window=2)] == list(range(50))
        p = _Pump(bad())
        assert await p.__anext__() == 1
        with pytest.raises(ValueError, match="boom"):
            await p.__anext__()
        with pytest.raises(StopAsyncIteration):
            await p.__anext__()

    asyncio.run(main())
