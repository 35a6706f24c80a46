"""asyncio flavour of background processes (:mod:`sbx.processes`):
``await sb.exec(..., background=True)`` and ``sb.processes`` of an
:class:`~sbx.aio.AsyncSandbox`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Union

from ._aio import _in_own_thread, _to_thread
from .aio import AsyncOutputStream
from .process import ExitStatus
from .processes import BackgroundProcess, Processes

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = ["AsyncBackgroundProcess", "AsyncProcesses"]


class AsyncBackgroundProcess:
    """Async view of a :class:`~sbx.BackgroundProcess`; ``async for line in
    p.stdout`` replays its kept output, then follows it."""

    def __init__(self, proc: BackgroundProcess) -> None:
        self.sync = proc
        self._stdout: Optional[AsyncOutputStream] = None
        self._stderr: Optional[AsyncOutputStream] = None

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def pid(self) -> int:
        return self.sync.pid

    @property
    def tag(self) -> str:
        return self.sync.tag

    @property
    def running(self) -> bool:
        return self.sync.running

    @property
    def exit_status(self) -> Optional[ExitStatus]:
        return self.sync.exit_status

    @property
    def returncode(self) -> Optional[int]:
        return self.sync.returncode

    @property
    def stdout(self) -> AsyncOutputStream:
        if self._stdout is None:
            self._stdout = AsyncOutputStream(self.sync.stdout)
        return self._stdout

    @property
    def stderr(self) -> AsyncOutputStream:
        if self._stderr is None:
            self._stderr = AsyncOutputStream(self.sync.stderr)
        return self._stderr

    async def output(self, tail: Optional[int] = None) -> "tuple[str, str]":
        return await _to_thread(self.sync.output, tail)

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        await _to_thread(self.sync.send_stdin, data)

    async def close_stdin(self) -> None:
        await _to_thread(self.sync.close_stdin)

    async def resize(self, rows: int, cols: int) -> None:
        await _to_thread(self.sync.resize, rows, cols)

    async def signal(self, sig: Union[int, str]) -> None:
        await _to_thread(self.sync.signal, sig)

    async def kill(self) -> None:
        await _to_thread(self.sync.kill)

    async def wait(self, timeout: Optional[float] = None) -> int:
        return await _in_own_thread(lambda: self.sync.wait(timeout))

    async def refresh(self) -> "AsyncBackgroundProcess":
        await _to_thread(self.sync.refresh)
        return self

    async def remove(self) -> None:
        await _to_thread(self.sync.remove)

    async def __aenter__(self) -> "AsyncBackgroundProcess":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _to_thread(self.sync.__exit__, None, None, None)

    def __repr__(self) -> str:
        return repr(self.sync).replace("<sbx.", "<sbx.aio.", 1)


class AsyncProcesses:
    """Async view of :class:`~sbx.Processes` (``sb.processes``)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self.sync = Processes(sandbox)

    async def start(self, cmd: Union[str, Sequence[str]], **kwargs: Any) -> AsyncBackgroundProcess:
        """Start a background process (arguments of :meth:`Processes.start`)."""
        return AsyncBackgroundProcess(await _to_thread(self.sync.start, cmd, **kwargs))

    async def list(self) -> List[AsyncBackgroundProcess]:
        return [AsyncBackgroundProcess(p) for p in await _to_thread(self.sync.list)]

    async def connect(self, process: Union[int, str]) -> AsyncBackgroundProcess:
        return AsyncBackgroundProcess(await _to_thread(self.sync.connect, process))

    get = connect

