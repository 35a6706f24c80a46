"""asyncio flavour of the SDK: the same API with coroutines.

The blocking client runs in worker threads (``asyncio.to_thread``), so this
module stays thin and behaves exactly like the synchronous one::

    import asyncio
    from sbx.aio import AsyncSandbox

    async def main():
        async with await AsyncSandbox.create(memory="256M") as sb:
            r = await sb.run("echo hi")
            p = await sb.exec("sh", "-c", "echo a; sleep 1; echo b")
            async for line in p.stdout:
                print(line, end="")
            print(await p.wait())

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import threading
import os
from typing import IO, TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ._aio import (
    AsyncCodebases, AsyncCodeContext, AsyncLogLines, AsyncLogs, AsyncSandboxFile, AsyncSession, AsyncTenants,
    _in_own_thread, _Pump, _to_thread,
)
from .client import Client
from .code import CodeResult
from .files import Data, Files
from .images import Images
from .ports import Port
from .process import CommandResult, ExitStatus, OutputStream, Process
from .sandbox import Sandbox, Seconds
from .observe import Event, SandboxUsage
from .tenants import Tenant
from .types import FileInfo, ImageInfo, ImageProgress, NetworkPolicy, SandboxInfo, SandboxStats, Size
from .volumes import Volume, Volumes

if TYPE_CHECKING:
    from . import aio_processes

__all__ = [
    "AsyncClient", "AsyncSandbox", "AsyncProcess", "AsyncOutputStream", "AsyncFiles", "AsyncImages",
    "AsyncVolumes", "AsyncCodebases", "AsyncTenants", "AsyncCodeContext", "AsyncSession", "AsyncLogs",
    "AsyncLogLines", "AsyncSandboxFile",
]

class AsyncOutputStream:
    """Async view of an :class:`~sbx.OutputStream`: ``async for line in
    stream`` yields lines as they are printed. A pump thread moves chunks
    from the process's queue to an :class:`asyncio.Queue`."""

    def __init__(self, stream: OutputStream) -> None:
        self._s = stream
        self._q: "Optional[asyncio.Queue[Optional[bytes]]]" = None
        self._buf = b""
        self._eof = False

    def _start_pump(self) -> "asyncio.Queue[Optional[bytes]]":
        if self._q is None:
            loop = asyncio.get_running_loop()
            q: "asyncio.Queue[Optional[bytes]]" = asyncio.Queue()
            self._q = q

            def pump() -> None:
                for chunk in self._s.iter_bytes():
                    loop.call_soon_threadsafe(q.put_nowait, chunk)
                loop.call_soon_threadsafe(q.put_nowait, None)

            threading.Thread(target=pump, name=f"sbx-aio-{self._s.name}", daemon=True).start()
        return self._q

    async def _chunk(self) -> Optional[bytes]:
        if self._eof:
            return None
        chunk = await self._start_pump().get()
        if chunk is None:
            self._eof = True
        return chunk

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            line = await self.readline()
            if not line:
                return
            yield line

    async def readline_bytes(self) -> bytes:
        """The next line as bytes; ``b""`` at the end."""
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[: i + 1], self._buf[i + 1 :]
                return line
            chunk = await self._chunk()
            if chunk is None:
                line, self._buf = self._buf, b""
                return line
            self._buf += chunk

    async def readline(self) -> str:
        """The next line; ``""`` at the end."""
        return (await self.readline_bytes()).decode("utf-8", "replace")

    async def read_bytes(self) -> bytes:
        """Everything until the stream ends, as bytes."""
        parts = [self._buf]
        self._buf = b""
        while True:
            chunk = await self._chunk()
            if chunk is None:
                return b"".join(parts)
            parts.append(chunk)

    async def read(self) -> str:
        """Everything until the stream ends."""
        return (await self.read_bytes()).decode("utf-8", "replace")


class AsyncProcess:
    """Async view of a :class:`~sbx.Process`."""

    def __init__(self, proc: Process) -> None:
        self.sync = proc
        self.stdout = AsyncOutputStream(proc.stdout)
        self.stderr = AsyncOutputStream(proc.stderr)

    @property
    def pid(self) -> int:
        """The command's pid inside the sandbox."""
        return self.sync.pid

    @property
    def args(self) -> List[str]:
        """The command's argv."""
        return self.sync.args

    @property
    def timed_out(self) -> bool:
        """Whether the command was killed at its timeout."""
        return self.sync.timed_out

    def poll(self) -> Optional[int]:
        """The exit code if the command has exited, else ``None`` (never blocks)."""
        return self.sync.poll()

    @property
    def returncode(self) -> Optional[int]:
        """The exit code, or ``None`` while the command runs."""
        return self.sync.returncode

    @property
    def exit_status(self) -> Optional[ExitStatus]:
        """How the command ended (``None`` while it runs)."""
        return self.sync.exit_status

    async def wait(self) -> int:
        """Wait for the command to exit; returns its exit code."""
        return await _in_own_thread(self.sync.wait)

    async def result(self) -> CommandResult:
        """Wait and collect the output not consumed yet."""
        out = await self.stdout.read_bytes()
        err = await self.stderr.read_bytes()
        await self.wait()
        st = self.sync.exit_status
        assert st is not None
        return CommandResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=st.exit_code,
            timed_out=st.timed_out,
            signal=st.signal,
            error=st.error,
            duration=st.duration,
            oom_killed=st.oom_killed,
            pids_limit_hit=st.pids_limit_hit,
            stdout_bytes=out,
            stderr_bytes=err,
        )

    def kill(self) -> None:
        """Kill the command (by abandoning the call)."""
        self.sync.kill()

    async def __aenter__(self) -> "AsyncProcess":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _in_own_thread(lambda: self.sync.__exit__(None, None, None))


class AsyncFiles:
    """Async view of :class:`~sbx.Files`. Transfers of file data run in a
    thread of their own (they may take long), the rest in the pool."""

    def __init__(self, files: Files) -> None:
        self.sync = files

    async def read(self, path: str, offset: int = 0, length: int = 0) -> bytes:
        """A file's content."""
        return await _in_own_thread(lambda: self.sync.read(path, offset, length))

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """A file's content as text."""
        return await _in_own_thread(lambda: self.sync.read_text(path, encoding, errors))

    def iter_read(self, path: str, offset: int = 0, length: int = 0) -> AsyncIterator[bytes]:
        """A file's content in chunks: ``async for chunk in sb.files.iter_read(p)``."""
        return _Pump(self.sync.iter_read(path, offset, length))

    async def write_text(self, path: str, text: str, mode: int = 0o644, encoding: str = "utf-8") -> int:
        """Write ``text`` to a file of the sandbox."""
        return await _in_own_thread(lambda: self.sync.write_text(path, text, mode, encoding))

    def iter_download_tar(self, remote_path: str) -> AsyncIterator[bytes]:
        """A tar of a sandbox path, in chunks."""
        return _Pump(self.sync.iter_download_tar(remote_path))

    async def write(
        self, path: str, data: Data, mode: int = 0o644, *, append: bool = False, make_parents: bool = True
    ) -> int:
        """Write a file (bytes, str or a binary file; creating parents);
        returns the bytes written."""
        return await _in_own_thread(
            lambda: self.sync.write(path, data, mode, append=append, make_parents=make_parents)
        )

    async def upload_file(self, local_path: str, remote_path: str, mode: Optional[int] = None) -> int:
        """Copy a local file into the sandbox."""
        return await _in_own_thread(lambda: self.sync.upload_file(local_path, remote_path, mode))

    async def download_file(self, remote_path: str, local: Union[str, "os.PathLike[str]", IO[bytes]]) -> int:
        """Copy a file of the sandbox to a local path or binary file."""
        return await _in_own_thread(lambda: self.sync.download_file(remote_path, local))

    async def upload_tar(self, remote_dir: str, tar: Union[bytes, IO[bytes]]) -> Dict[str, int]:
        """Extract a tar stream into a sandbox directory."""
        return await _in_own_thread(lambda: self.sync.upload_tar(remote_dir, tar))

    async def download_tar(self, remote_path: str) -> bytes:
        """A tar of a sandbox path."""
        return await _in_own_thread(lambda: self.sync.download_tar(remote_path))

    async def list(self, path: str = ".", recursive: bool = False, max_depth: int = 0) -> List[FileInfo]:
        """List a directory."""
        return await _to_thread(self.sync.list, path, recursive, max_depth)

    async def stat(self, path: str) -> FileInfo:
        """Describe one path."""
        return await _to_thread(self.sync.stat, path)

    async def exists(self, path: str) -> bool:
        """Whether a path exists."""
        return await _to_thread(self.sync.exists, path)

    async def mkdir(self, path: str, parents: bool = True, mode: int = 0) -> None:
        """Create a directory."""
        await _to_thread(self.sync.mkdir, path, parents, mode)

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a path."""
        await _to_thread(self.sync.remove, path, recursive)

    async def rename(self, src: str, dst: str) -> None:
        """Move a path."""
        await _to_thread(self.sync.rename, src, dst)

    async def upload_dir(self, local_dir: str, remote_dir: str) -> int:
        """Copy a local directory's contents into the sandbox."""
        return await _in_own_thread(lambda: self.sync.upload_dir(local_dir, remote_dir))

    async def download_dir(self, remote_dir: str, local_dir: str) -> int:
        """Copy a sandbox directory's contents to a local directory (safely)."""
        return await _in_own_thread(lambda: self.sync.download_dir(remote_dir, local_dir))


class AsyncImages:
    """Async view of :class:`~sbx.Images`."""

    def __init__(self, images: Images) -> None:
        self.sync = images

    async def pull(self, ref: str, progress: Optional[Callable[[ImageProgress], None]] = None) -> ImageInfo:
        """Pull an image (``progress`` is called from a worker thread)."""
        return await _to_thread(self.sync.pull, ref, progress)

    async def ensure(self, ref: str, progress: Optional[Callable[[ImageProgress], None]] = None) -> Optional[ImageInfo]:
        """Make sure ``ref`` is stored, pulling it if missing (see :meth:`Images.ensure`)."""
        return await _to_thread(self.sync.ensure, ref, progress)

    async def list(self) -> List[ImageInfo]:
        """Every stored image."""
        return await _to_thread(self.sync.list)

    async def get(self, ref: str) -> ImageInfo:
        """Describe one image."""
        return await _to_thread(self.sync.get, ref)

    async def disk_usage(self) -> int:
        """Bytes all layers take on disk."""
        return await _to_thread(self.sync.disk_usage)

    async def tag(self, source: str, target: str) -> None:
        """Give an image another reference."""
        await _to_thread(self.sync.tag, source, target)

    async def remove(self, ref: str) -> None:
        """Untag an image."""
        await _to_thread(self.sync.remove, ref)

    async def prune(self) -> int:
        """Free unused layers; returns the bytes freed."""
        return await _to_thread(self.sync.prune)

    async def import_tar(self, source: Any, tag: str = "", *, use_archive_tags: bool = False,
                         replace_archive_tags: bool = False) -> List[ImageInfo]:
        """Import a docker-save or OCI-layout tarball (a path or binary file)."""
        return await _in_own_thread(lambda: self.sync.import_tar(
            source, tag, use_archive_tags=use_archive_tags, replace_archive_tags=replace_archive_tags))

    async def export(self, ref: str, dest: Any) -> int:
        """Write an image as a docker-save tarball to a path or binary file."""
        return await _in_own_thread(lambda: self.sync.export(ref, dest))

    async def build(self, recipe: Any, tag: str = "", *, no_cache: bool = False,
                    progress: Optional[Callable[[ImageProgress], None]] = None) -> ImageInfo:
        """Build a recipe (``progress`` is called from a worker thread)."""
        return await _to_thread(lambda: self.sync.build(recipe, tag, no_cache=no_cache, progress=progress))


class AsyncVolumes:
    """Async view of :class:`~sbx.Volumes`."""

    def __init__(self, volumes: Volumes) -> None:
        self.sync = volumes

    async def create(self, name: str, size: Optional[Size] = None) -> Volume:
        """Create a volume with a size quota."""
        return await _to_thread(self.sync.create, name, size)

    async def list(self) -> List[Volume]:
        """Every volume."""
        return await _to_thread(self.sync.list)

    async def get(self, name: str) -> Volume:
        """Describe one volume."""
        return await _to_thread(self.sync.get, name)

    async def remove(self, name: str) -> None:
        """Delete a volume and its data."""
        await _to_thread(self.sync.remove, name)


class AsyncClient:
    """Async view of :class:`~sbx.Client`."""

    def __init__(
        self,
        addr: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        client: Optional[Client] = None,
        token: Optional[str] = None,
        cacert: Optional[str] = None,
        file_compression: bool = False,
    ) -> None:
        self.sync = client if client is not None else Client(
            addr, timeout=timeout, token=token, cacert=cacert, file_compression=file_compression
        )
        self.images = AsyncImages(self.sync.images)
        self.volumes = AsyncVolumes(self.sync.volumes)
        self.codebases = AsyncCodebases(self.sync.codebases)
        self.tenants = AsyncTenants(self.sync.tenants)

    @property
    def addr(self) -> str:
        """The daemon's address."""
        return self.sync.addr

    async def version(self) -> Dict[str, Any]:
        """The daemon's version and runtimes."""
        return await _to_thread(self.sync.version)

    async def tenant(self) -> Tenant:
        """The token's tenant: its quotas and usage."""
        return await _to_thread(self.sync.tenant)

    async def stats(self, *sandboxes: str, history: bool = False) -> List[SandboxUsage]:
        """Current usage of sandboxes (see :meth:`Client.stats`)."""
        return await _to_thread(lambda: self.sync.stats(*sandboxes, history=history))

    async def events(self, **kwargs: Any) -> AsyncIterator[Event]:
        """Iterate events (the arguments of :meth:`Client.events`)::

            async for ev in client.events(types=["oom"]):
                print(ev.sandbox_id)

        Leaving the loop closes the stream."""
        stream = await _to_thread(lambda: self.sync.events(**kwargs))
        pump = _Pump(stream)  # at most a few events ahead: a slow reader is dropped by the daemon
        try:
            async for ev in pump:
                yield ev
        finally:
            await pump.aclose()
            stream.close()

    async def create(self, **kwargs: Any) -> "AsyncSandbox":
        """Create a sandbox (arguments of :meth:`Sandbox.create`)."""
        return await AsyncSandbox.create(client=self, **kwargs)

    async def get(self, ref: str) -> "AsyncSandbox":
        """Find a sandbox by id or name."""
        return await AsyncSandbox.from_id(ref, client=self)

    async def list(
        self, labels: Optional[Mapping[str, Optional[str]]] = None, selectors: Optional[Sequence[str]] = None
    ) -> List["AsyncSandbox"]:
        """Sandboxes matching labels and selectors."""
        return await AsyncSandbox.list(labels=labels, selectors=selectors, client=self)


def _sync_client(client: Union[AsyncClient, Client, None]) -> Optional[Client]:
    if isinstance(client, AsyncClient):
        return client.sync
    return client


class AsyncSandbox:
    """Async view of :class:`~sbx.Sandbox`: the same methods, as coroutines.
    ``async with`` terminates a sandbox this handle created on exit (not one
    found with ``from_id``, ``from_name`` or ``list``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.files = AsyncFiles(sandbox.files)

    @classmethod
    async def from_local(cls, path: Any, *, client: Union[AsyncClient, Client, None] = None, **kwargs: Any) -> "AsyncSandbox":
        """Upload ``path`` as a codebase and create a sandbox mounting it,
        guarded (default ``"view-only"``); see :meth:`Sandbox.from_local`."""
        return cls(await _in_own_thread(lambda: Sandbox.from_local(path, client=_sync_client(client), **kwargs)))

    @property
    def owned(self) -> bool:
        """Whether this handle created the sandbox."""
        return self.sync.owned

    @property
    def client(self) -> Client:
        """The (blocking) client this sandbox was found with."""
        return self.sync.client

    @classmethod
    async def create(cls, image: Optional[str] = None, *, client: Union[AsyncClient, Client, None] = None, **kwargs: Any) -> "AsyncSandbox":
        """Create a sandbox; see :meth:`Sandbox.create` for the arguments."""
        sb = await _to_thread(Sandbox.create, image, client=_sync_client(client), **kwargs)
        return cls(sb)

    @classmethod
    async def from_id(cls, sandbox_id: str, *, client: Union[AsyncClient, Client, None] = None) -> "AsyncSandbox":
        """Find a sandbox by id or name."""
        return cls(await _to_thread(Sandbox.from_id, sandbox_id, client=_sync_client(client)))

    @classmethod
    async def from_name(cls, name: str, *, client: Union[AsyncClient, Client, None] = None) -> "AsyncSandbox":
        """Find a sandbox by name."""
        return await cls.from_id(name, client=client)

    @classmethod
    async def list(
        cls,
        labels: Optional[Mapping[str, Optional[str]]] = None,
        selectors: Optional[Sequence[str]] = None,
        *,
        client: Union[AsyncClient, Client, None] = None,
    ) -> List["AsyncSandbox"]:
        """Sandboxes matching labels and selectors."""
        found = await _to_thread(Sandbox.list, labels, selectors, client=_sync_client(client))
        return [cls(s) for s in found]

    @property
    def id(self) -> str:
        """The sandbox's id."""
        return self.sync.id

    @property
    def name(self) -> str:
        """The sandbox's name."""
        return self.sync.name

    @property
    def state(self) -> str:
        """State at the last snapshot (see :meth:`refresh`)."""
        return self.sync.state

    @property
    def labels(self) -> Dict[str, str]:
        """The sandbox's labels."""
        return self.sync.labels

    @property
    def info(self) -> SandboxInfo:
        """The last snapshot."""
        return self.sync.info

    async def stats(self) -> SandboxStats:
        """Live usage (a coroutine here, unlike the sync property)."""
        return await _to_thread(lambda: self.sync.stats)

    async def refresh(self) -> "AsyncSandbox":
        """Reload :attr:`info`."""
        await _to_thread(self.sync.refresh)
        return self

    async def stop(self) -> None:
        """Freeze the sandbox."""
        await _to_thread(self.sync.stop)

    async def get_host(self, port: int) -> str:
        """See :meth:`Sandbox.get_host`."""
        return await _to_thread(self.sync.get_host, port)

    async def get_port(self, port: int) -> Port:
        """See :meth:`Sandbox.get_port`."""
        return await _to_thread(self.sync.get_port, port)

    async def ports(self) -> List[Port]:
        """See :meth:`Sandbox.ports`."""
        return await _to_thread(self.sync.ports)

    async def start(self) -> None:
        """Resume the sandbox."""
        await _to_thread(self.sync.start)

    async def terminate(self, *, sync_codebases: bool = False) -> None:
        """Destroy the sandbox."""
        await _to_thread(self.sync.terminate, sync_codebases=sync_codebases)

    async def sync_codebase(self, path: Optional[str] = None, *, dry_run: bool = False, force: bool = False) -> Any:
        """See :meth:`sbx.Sandbox.sync_codebase`."""
        return await _to_thread(self.sync.sync_codebase, path, dry_run=dry_run, force=force)

    destroy = terminate

    async def snapshot(self, tag: str = "") -> ImageInfo:
        """Save the sandbox's filesystem as a new image."""
        return await _to_thread(self.sync.snapshot, tag)

    async def update_network(self, network: Union[str, NetworkPolicy]) -> None:
        """Change the network policy of the running sandbox."""
        await _to_thread(self.sync.update_network, network)

    async def update(self, **kwargs: Any) -> None:
        """Change lifetime, labels, limits or auto-resume (arguments of
        :meth:`Sandbox.update`)."""
        await _to_thread(lambda: self.sync.update(**kwargs))

    async def set_timeout(self, timeout: Seconds) -> None:
        """A new lifetime counted from now (see :meth:`Sandbox.set_timeout`)."""
        await _to_thread(self.sync.set_timeout, timeout)

    async def set_labels(self, labels: Mapping[str, str]) -> None:
        """Make the labels exactly ``labels`` (see :meth:`Sandbox.set_labels`)."""
        await _to_thread(self.sync.set_labels, labels)

    #: Modal's name for :meth:`set_labels`.
    set_tags = set_labels

    async def exec(self, *args: str, **kwargs: Any) -> "Union[AsyncProcess, aio_processes.AsyncBackgroundProcess]":
        """Start a command (arguments of :meth:`Sandbox.exec`); iterate
        ``async for line in proc.stdout``. With ``background=True`` an
        :class:`~sbx.aio_processes.AsyncBackgroundProcess`."""
        from . import aio_processes

        p = await _to_thread(self.sync.exec, *args, **kwargs)
        if isinstance(p, Process):
            return AsyncProcess(p)
        return aio_processes.AsyncBackgroundProcess(p)

    @property
    def processes(self) -> "aio_processes.AsyncProcesses":
        """The sandbox's background processes (an :class:`~sbx.aio_processes.AsyncProcesses`)."""
        from . import aio_processes

        return aio_processes.AsyncProcesses(self.sync)

    async def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        timeout: Optional[Seconds] = None,
        raise_on_error: bool = False,
        **kwargs: Any,
    ) -> CommandResult:
        """Run a command to completion (arguments of :meth:`Sandbox.run`)."""
        return await _in_own_thread(
            lambda: self.sync.run(cmd, timeout=timeout, raise_on_error=raise_on_error, **kwargs)
        )

    # -- the sandbox's own command -----------------------------------------

    async def logs(self, *, follow: bool = False, since: Any = None, tail: Optional[int] = None) -> AsyncLogs:
        """The output of the sandbox's own command; ``async for chunk in
        await sb.logs(follow=True)``. See :meth:`Sandbox.logs`."""
        return AsyncLogs(await _to_thread(lambda: self.sync.logs(follow=follow, since=since, tail=tail)))

    @property
    def stdout(self) -> AsyncLogLines:
        """The command's stdout lines, followed until it exits."""
        return AsyncLogLines(self.sync.stdout)

    @property
    def stderr(self) -> AsyncLogLines:
        """The command's stderr lines, followed until it exits."""
        return AsyncLogLines(self.sync.stderr)

    async def wait(self, timeout: Optional[float] = None) -> ExitStatus:
        """Wait for the sandbox's own command to exit."""
        return await _in_own_thread(lambda: self.sync.wait(timeout))

    async def returncode(self) -> Optional[int]:
        """The command's exit code, or ``None`` while it runs (a coroutine
        here, unlike the sync property)."""
        return await _to_thread(lambda: self.sync.returncode)

    # -- code and sessions --------------------------------------------------

    async def run_code(self, code: Optional[str] = None, language: Optional[str] = None, **kwargs: Any) -> CodeResult:
        """Run a program (arguments of :meth:`Sandbox.run_code`; a ``context``
        may be an :class:`AsyncCodeContext`)."""
        ctx = kwargs.get("context")
        if isinstance(ctx, AsyncCodeContext):
            kwargs["context"] = ctx.sync
        return await _in_own_thread(lambda: self.sync.run_code(code, language, **kwargs))

    async def create_context(self, language: str = "python", **kwargs: Any) -> AsyncCodeContext:
        """Start a stateful context (see :meth:`Sandbox.create_context`)."""
        return AsyncCodeContext(await _to_thread(lambda: self.sync.create_context(language, **kwargs)))

    async def list_contexts(self) -> List[AsyncCodeContext]:
        """The sandbox's live contexts."""
        return [AsyncCodeContext(c) for c in await _to_thread(self.sync.list_contexts)]

    async def session(self, **kwargs: Any) -> AsyncSession:
        """Start a stateful shell session (see :meth:`Sandbox.session`)."""
        return AsyncSession(await _to_thread(lambda: self.sync.session(**kwargs)))

    async def list_sessions(self) -> List[AsyncSession]:
        """The sandbox's live shell sessions."""
        return [AsyncSession(s) for s in await _to_thread(self.sync.list_sessions)]

    async def open(self, path: str, mode: str = "r", **kwargs: Any) -> AsyncSandboxFile:
        """Open a file of the sandbox (see :meth:`Sandbox.open`):
        ``async with await sb.open(p, "w") as f: await f.write("x")``."""
        return AsyncSandboxFile(await _in_own_thread(lambda: self.sync.open(path, mode, **kwargs)))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await _in_own_thread(lambda: self.sync.__exit__(None, None, None))

    def __repr__(self) -> str:
        return f"<sbx.aio.AsyncSandbox {self.id} {self.state}>"
