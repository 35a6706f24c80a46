"""File access inside a sandbox: ``sandbox.files``."""

from __future__ import annotations

import io
import warnings
import os
import tempfile
from typing import IO, Any, Dict, Iterator, List, Optional, Union

from ._tar import UnsafeArchiveError, pack_dir, safe_extract
from ._transport import Transport, b64decode, b64encode
from .errors import NotFoundError
from .types import FileInfo

__all__ = ["Files", "UnsafeArchiveError"]

_SERVICE = "sbx.v1.SandboxService"
#: Bytes per streamed message (base64 makes the JSON about 4/3 of this).
CHUNK_SIZE = 256 << 10

Data = Union[bytes, bytearray, memoryview, str, IO[bytes]]


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class Files:
    """Files of one sandbox. Paths are absolute or relative to the sandbox's
    working directory. Obtain it as :attr:`Sandbox.files`."""

    def __init__(self, transport: Transport, sandbox_id: str) -> None:
        self._t = transport
        self._id = sandbox_id

    # -- reading -------------------------------------------------------------

    def iter_read(self, path: str, offset: int = 0, length: int = 0) -> Iterator[bytes]:
        """Yield a file's content in chunks as they arrive.

        Args:
            offset: where to start reading.
            length: how many bytes to read (0: to the end).
        """
        req: Dict[str, Any] = {"sandbox": self._id, "path": path}
        if offset:
            req["offset"] = str(offset)
        if length:
            req["length"] = str(length)
        with self._t.server_stream(_SERVICE, "ReadFile", req, op=f"read {path}") as stream:
            for msg in stream:
                data = b64decode(msg.get("data") or "")
                if data:
                    yield data

    def read(self, path: str, offset: int = 0, length: int = 0) -> bytes:
        """Return a file's content (or ``length`` bytes of it from ``offset``).

        Raises:
            NotFoundError: the file does not exist.
        """
        return b"".join(self.iter_read(path, offset, length))

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Return a file's content decoded as text."""
        return self.read(path).decode(encoding, errors)

    def download_file(self, remote_path: str, local_path: str) -> int:
        """Copy a file of the sandbox to ``local_path``; returns its size."""
        n = 0
        tmp = local_path + ".sbx-partial"
        try:
            with open(tmp, "wb") as f:
                for chunk in self.iter_read(remote_path):
                    # Holes of a sparse file arrive as zeros: keep them holes.
                    if chunk.count(0) == len(chunk):
                        f.seek(len(chunk), os.SEEK_CUR)
                    else:
                        f.write(chunk)
                    n += len(chunk)
                f.truncate()
            os.replace(tmp, local_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return n

    # -- writing -------------------------------------------------------------

    @staticmethod
    def _chunks(data: Data) -> Iterator[bytes]:
        if isinstance(data, str):
            data = data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)):
            mv = memoryview(data)
            for i in range(0, len(mv), CHUNK_SIZE):
                yield bytes(mv[i : i + CHUNK_SIZE])
            return
        if hasattr(data, "read"):
            while True:
                chunk = data.read(CHUNK_SIZE)
                if not chunk:
                    return
                if isinstance(chunk, str):
                    chunk = chunk.encode("utf-8")
                yield chunk
            return
        raise TypeError(f"cannot write {type(data).__name__}: want bytes, str or a binary file")

    def write(
        self,
        path: str,
        data: Data,
        mode: int = 0o644,
        *,
        append: bool = False,
        make_parents: bool = True,
    ) -> int:
        """Write ``data`` (bytes, str encoded as UTF-8, or a binary file object)
        to a file of the sandbox, creating missing parent directories. The file
        appears whole or not at all. Returns the number of bytes written.

        Args:
            mode: permission bits of a new file.
            append: append instead of replacing.
            make_parents: create missing parent directories.
        """
        header: Dict[str, Any] = {"sandbox": self._id, "path": path, "mode": mode}
        if append:
            header["append"] = True
        if make_parents:
            header["makeParents"] = True

        def messages() -> Iterator[Dict[str, Any]]:
            yield {"header": header}
            for chunk in self._chunks(data):
                yield {"data": b64encode(chunk)}

        resp = self._t.client_stream(_SERVICE, "WriteFile", messages(), op=f"write {path}")
        return int(resp.get("bytesWritten") or 0)

    def write_text(self, path: str, text: str, mode: int = 0o644, encoding: str = "utf-8") -> int:
        """Write ``text`` to a file of the sandbox."""
        return self.write(path, text.encode(encoding), mode)

    def upload_file(self, local_path: str, remote_path: str, mode: Optional[int] = None) -> int:
        """Copy a local file into the sandbox (keeping its permission bits
        unless ``mode`` is given); returns the bytes written."""
        if mode is None:
            mode = os.stat(local_path).st_mode & 0o777
        with open(local_path, "rb") as f:
            return self.write(remote_path, f, mode)

    # -- metadata ------------------------------------------------------------

    def list(self, path: str = ".", recursive: bool = False, max_depth: int = 0) -> List[FileInfo]:
        """List a directory (with ``recursive``, everything below it, down to
        ``max_depth`` levels; 0 means no limit)."""
        req: Dict[str, Any] = {"sandbox": self._id, "path": path}
        if recursive:
            req["recursive"] = True
        if max_depth:
            req["maxDepth"] = max_depth
        resp = self._t.unary(_SERVICE, "ListDir", req, op=f"list {path}")
        return [FileInfo.from_json(e) for e in resp.get("entries") or []]

    def stat(self, path: str) -> FileInfo:
        """Describe one path (symlinks are not followed).

        Raises:
            NotFoundError: the path does not exist.
        """
        resp = self._t.unary(_SERVICE, "Stat", {"sandbox": self._id, "path": path}, op=f"stat {path}")
        return FileInfo.from_json(resp.get("info") or {})

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the sandbox."""
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def mkdir(self, path: str, parents: bool = True, mode: int = 0) -> None:
        """Create a directory (and its missing parents unless ``parents=False``)."""
        req: Dict[str, Any] = {"sandbox": self._id, "path": path, "parents": parents}
        if mode:
            req["mode"] = mode
        self._t.unary(_SERVICE, "MakeDir", req, op=f"mkdir {path}")

    def remove(self, path: str, recursive: bool = False) -> None:
        """Delete a file (or a directory with ``recursive=True``)."""
        req: Dict[str, Any] = {"sandbox": self._id, "path": path, "recursive": recursive}
        self._t.unary(_SERVICE, "Remove", req, op=f"remove {path}")

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` within the sandbox."""
        req = {"sandbox": self._id, "from": src, "to": dst}
        self._t.unary(_SERVICE, "Rename", req, op=f"rename {src}")

    # -- directories as tar --------------------------------------------------

    def upload_tar(self, remote_dir: str, tar: Union[bytes, IO[bytes]]) -> Dict[str, int]:
        """Extract a tar stream (bytes or binary file) into ``remote_dir``
        (created if missing). Returns ``{"files": n, "bytes": n}``."""

        def messages() -> Iterator[Dict[str, Any]]:
            yield {"header": {"sandbox": self._id, "path": remote_dir}}
            for chunk in self._chunks(tar):
                yield {"data": b64encode(chunk)}

        resp = self._t.client_stream(_SERVICE, "UploadTar", messages(), op=f"upload to {remote_dir}")
        return {"files": int(resp.get("files") or 0), "bytes": int(resp.get("bytes") or 0)}

    def upload_dir(self, local_dir: str, remote_dir: str) -> int:
        """Copy the contents of ``local_dir`` into ``remote_dir`` of the sandbox
        (created if missing). Returns the number of files written."""
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(local_dir)
        with tempfile.SpooledTemporaryFile(max_size=16 << 20) as spool:
            pack_dir(local_dir, spool)
            spool.seek(0)
            return self.upload_tar(remote_dir, spool)["files"]

    def iter_download_tar(self, remote_path: str) -> Iterator[bytes]:
        """Yield a tar of ``remote_path`` (a directory's contents, or one file)
        in chunks as they arrive."""
        req = {"sandbox": self._id, "path": remote_path}
        with self._t.server_stream(_SERVICE, "DownloadTar", req, op=f"download {remote_path}") as stream:
            for msg in stream:
                data = b64decode(msg.get("data") or "")
                if data:
                    yield data

    def download_tar(self, remote_path: str) -> bytes:
        """Return a tar of ``remote_path`` (a directory's contents, or one file)."""
        return b"".join(self.iter_download_tar(remote_path))

    def download_dir(self, remote_dir: str, local_dir: str) -> int:
        """Copy the contents of ``remote_dir`` of the sandbox into ``local_dir``
        (created if missing). Extraction is safe: symlinks whose target leaves
        ``local_dir`` (absolute, or climbing out with ``..``) are not created
        and are listed in a :class:`UserWarning`; symlinks inside are kept.
        Entries with absolute paths or ``..``, device nodes and entries below
        a symlink of the same archive are refused with
        :class:`UnsafeArchiveError`. Returns the number of entries extracted."""
        reader = io.BufferedReader(_ChunkReader(self.iter_download_tar(remote_dir)), CHUNK_SIZE)
        skipped: List[str] = []
        try:
            n = safe_extract(reader, local_dir, skipped=skipped)
        finally:
            reader.close()
        if skipped:
            warnings.warn(f"download_dir: skipped {len(skipped)} symlink(s) pointing outside {local_dir}: "
                          + ", ".join(skipped), UserWarning, stacklevel=2)
        return n
