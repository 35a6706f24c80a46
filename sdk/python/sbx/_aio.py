"""The asyncio flavour's machinery and its smaller views (re-exported by
:mod:`sbx.aio`): blocking calls in threads, async iteration of blocking
iterators, and the async views of logs, files opened with ``open``,
codebases, tenants, code contexts and shell sessions."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, TypeVar, Union

from .code import CodeContext, CodeResult
from .codebase import Codebase, Codebases, SyncResult
from .logs import LogChunk, LogLines, SandboxLogs
from .process import ExitStatus
from .session import Session, SessionResult
from .tenants import Tenant, Tenants

T = TypeVar("T")


async def _to_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a short blocking call (a unary RPC) in the default thread pool."""
    return await asyncio.to_thread(func, *args, **kwargs)


async def _in_own_thread(func: Callable[[], T]) -> T:
    """Run a call that may block for long (waiting for a command) in a thread
    of its own, so that many waiting commands do not exhaust the pool."""
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[T]" = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.cancelled():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def target() -> None:
        try:
            value = func()
        except BaseException as e:  # delivered to the awaiting coroutine
            loop.call_soon_threadsafe(settle, False, e)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=target, name="sbx-aio", daemon=True).start()
    return await fut


class _Pump:
    """Async iteration of a blocking iterator: a thread of its own moves
    its items to an :class:`asyncio.Queue` (started at the first ``await``),
    at most ``window`` items ahead of the consumer, so a slow reader of a big
    download holds a few chunks, not the file. An exception of the iterator
    is raised by the ``await`` that reaches it. :meth:`aclose` (or dropping
    the object) stops the thread at its next item and closes the iterator."""

    _END = object()

    def __init__(self, it: Any, window: int = 8) -> None:
        self._it = it
        self._q: "Optional[asyncio.Queue[Any]]" = None
        self._credits = threading.Semaphore(window)
        self._stop = threading.Event()
        self._done = False

    def _start(self) -> "asyncio.Queue[Any]":
        if self._q is None:
            loop = asyncio.get_running_loop()
            q: "asyncio.Queue[Any]" = asyncio.Queue()
            self._q = q
            it, credits, stop = self._it, self._credits, self._stop

            def put(item: Any) -> None:
                try:
                    loop.call_soon_threadsafe(q.put_nowait, item)
                except RuntimeError:  # the loop is closed: nobody reads
                    stop.set()

            def pump() -> None:
                try:
                    for item in it:
                        credits.acquire()
                        if stop.is_set():
                            return
                        put((True, item))
                except BaseException as e:  # delivered to the awaiting coroutine
                    put((False, e))
                    return
                finally:
                    close = getattr(it, "close", None)
                    if close is not None:
                        close()
                put((True, _Pump._END))

            threading.Thread(target=pump, name="sbx-aio-pump", daemon=True).start()
        return self._q

    def __aiter__(self) -> "_Pump":
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        ok, item = await self._start().get()
        if not ok:
            self._done = True
            raise item
        if item is _Pump._END:
            self._done = True
            raise StopAsyncIteration
        self._credits.release()
        return item

    async def aclose(self) -> None:
        """Stop reading; the thread ends at its next item."""
        self._close()

    def _close(self) -> None:
        self._done = True
        self._stop.set()
        self._credits.release()  # wake a pump waiting for room

    def __del__(self) -> None:
        self._close()


class AsyncLogs:
    """Async view of :class:`~sbx.SandboxLogs`: ``async for chunk in
    await sb.logs(follow=True)``."""

    def __init__(self, logs: SandboxLogs) -> None:
        self.sync = logs
        self._pump = _Pump(logs)

    @property
    def exit(self) -> Optional[ExitStatus]:
        """How the command ended, once the chunks are all read."""
        return self.sync.exit

    @property
    def dropped_stdout(self) -> int:
        return self.sync.dropped_stdout

    @property
    def dropped_stderr(self) -> int:
        return self.sync.dropped_stderr

    def __aiter__(self) -> "AsyncLogs":
        return self

    async def __anext__(self) -> LogChunk:
        return await self._pump.__anext__()

    async def read(self) -> Dict[str, bytes]:
        """Read to the end; ``{"stdout": ..., "stderr": ...}``."""
        parts: Dict[str, List[bytes]] = {"stdout": [], "stderr": []}
        async for c in self:
            parts[c.stream].append(c.data)
        return {k: b"".join(v) for k, v in parts.items()}

    def close(self) -> None:
        """Stop reading (from any thread); the command is not affected."""
        self.sync.close()

    async def __aenter__(self) -> "AsyncLogs":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncLogLines:
    """Async view of :class:`~sbx.LogLines`: ``async for line in sb.stdout``."""

    def __init__(self, lines: LogLines) -> None:
        self.sync = lines
        self._pump = _Pump(lines)

    def __aiter__(self) -> "AsyncLogLines":
        return self

    async def __anext__(self) -> str:
        return await self._pump.__anext__()

    async def read(self) -> str:
        """The rest of the lines at once."""
        return "".join([line async for line in self])

    @property
    def exit(self) -> Optional[ExitStatus]:
        """How the command ended, once the lines are all read."""
        return self.sync.exit

    def close(self) -> None:
        self.sync.close()


class AsyncSandboxFile:
    """Async view of a file from :meth:`AsyncSandbox.open` (a
    :class:`~sbx.fileobj.SandboxFile` or text wrapper of one): reads and
    writes work on the local copy; ``flush`` and ``close`` send it."""

    def __init__(self, f: Any) -> None:
        self.sync = f

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def closed(self) -> bool:
        return bool(self.sync.closed)

    async def read(self, size: int = -1) -> Any:
        return self.sync.read(size)

    async def readline(self, size: int = -1) -> Any:
        return self.sync.readline(size)

    async def readlines(self) -> List[Any]:
        return self.sync.readlines()

    async def write(self, data: Any) -> int:
        return self.sync.write(data)

    async def writelines(self, lines: Any) -> None:
        self.sync.writelines(lines)

    async def seek(self, offset: int, whence: int = 0) -> int:
        return self.sync.seek(offset, whence)

    async def tell(self) -> int:
        return self.sync.tell()

    async def flush(self) -> None:
        await _in_own_thread(self.sync.flush)

    async def close(self) -> None:
        await _in_own_thread(self.sync.close)

    def __aiter__(self) -> "AsyncSandboxFile":
        return self

    async def __anext__(self) -> Any:
        line = self.sync.readline()
        if not line:
            raise StopAsyncIteration
        return line

    async def __aenter__(self) -> "AsyncSandboxFile":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncCodebases:
    """Async view of :class:`~sbx.codebase.Codebases` (which has a ``sync``
    method: the blocking object is ``_blocking`` here)."""

    def __init__(self, codebases: Codebases) -> None:
        self._blocking = codebases

    async def from_local(self, path: Any, **kwargs: Any) -> Codebase:
        """Upload a local directory as a codebase (arguments of
        :meth:`sbx.codebase.Codebases.from_local`)."""
        return await _in_own_thread(lambda: self._blocking.from_local(path, **kwargs))

    async def list(self) -> List[Codebase]:
        """Every codebase."""
        return await _to_thread(self._blocking.list)

    async def get(self, ref: str) -> Codebase:
        """Describe one codebase."""
        return await _to_thread(self._blocking.get, ref)

    def iter_download(self, ref: str) -> AsyncIterator[bytes]:
        """The current revision as a tar, in chunks."""
        return _Pump(self._blocking.iter_download(ref))

    async def download(self, ref: str, dest: Any = None) -> Union[bytes, int]:
        """The current revision as a tar (bytes, or written to ``dest``)."""
        return await _in_own_thread(lambda: self._blocking.download(ref, dest))

    async def delete(self, ref: str) -> None:
        """Delete a codebase."""
        await _to_thread(self._blocking.delete, ref)

    async def sync(self, sandbox: str, path: Optional[str] = None, *, dry_run: bool = False, force: bool = False) -> SyncResult:
        """Write a sandbox's changes back into its codebase."""
        return await _to_thread(lambda: self._blocking.sync(sandbox, path, dry_run=dry_run, force=force))


class AsyncTenants:
    """Async view of :class:`~sbx.tenants.Tenants`."""

    def __init__(self, tenants: Tenants) -> None:
        self.sync = tenants

    async def current(self) -> Tenant:
        """The token's tenant."""
        return await _to_thread(self.sync.current)

    async def get(self, name: str) -> Tenant:
        """One tenant (admin token)."""
        return await _to_thread(self.sync.get, name)

    async def list(self) -> List[Tenant]:
        """Every tenant (admin token)."""
        return await _to_thread(self.sync.list)


class AsyncCodeContext:
    """Async view of :class:`~sbx.CodeContext`; closed by ``async with``."""

    def __init__(self, ctx: CodeContext) -> None:
        self.sync = ctx

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def sandbox(self) -> str:
        return self.sync.sandbox

    @property
    def language(self) -> str:
        return self.sync.language

    async def run(self, code: str, **kwargs: Any) -> CodeResult:
        """Run code in the context (arguments of :meth:`sbx.CodeContext.run`)."""
        return await _in_own_thread(lambda: self.sync.run(code, **kwargs))

    async def close(self) -> None:
        """Stop the kernel."""
        await _to_thread(self.sync.close)

    async def __aenter__(self) -> "AsyncCodeContext":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSession:
    """Async view of :class:`~sbx.Session`; closed by ``async with``."""

    def __init__(self, session: Session) -> None:
        self.sync = session

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def sandbox(self) -> str:
        return self.sync.sandbox

    @property
    def shell(self) -> str:
        return self.sync.shell

    async def exec(self, command: str, **kwargs: Any) -> SessionResult:
        """Run a command line in the session (arguments of :meth:`sbx.Session.exec`)."""
        return await _in_own_thread(lambda: self.sync.exec(command, **kwargs))

    async def close(self) -> None:
        """Kill the shell and everything it started."""
        await _to_thread(self.sync.close)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


