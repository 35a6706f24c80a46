"""File access inside a sandbox: ``sandbox.files``."""

from __future__ import annotations

import io
import warnings
import os
import tempfile
from typing import IO, Any, Dict, Iterator, List, Optional, Union

from . import _proto
from ._tar import UnsafeArchiveError, pack_dir, safe_extract
from ._transport import RAW_UPLOAD_MIN, UPLOAD_CHUNK, ChunkStream, NoRawRoute, Transport, raw_read, raw_write, _raw_size
from .errors import NotFoundError
from .types import FileInfo

__all__ = ["Files", "UnsafeArchiveError"]

_SERVICE = "sbx.v1.SandboxService"
#: Bytes per uploaded message (downloads come as the daemon sends them).
CHUNK_SIZE = UPLOAD_CHUNK

Data = Union[bytes, bytearray, memoryview, str, IO[bytes]]

#: Zeros to compare downloaded chunks with (holes of sparse files).
_ZEROS = bytes(1 << 20)


def _all_zero(b: memoryview) -> bool:
    if len(b) <= len(_ZEROS):
        return _ZEROS.startswith(b)
    return all(_ZEROS.startswith(b[i : i + len(_ZEROS)]) for i in range(0, len(b), len(_ZEROS)))


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

    def _read_stream(self, path: str, offset: int, length: int) -> ChunkStream:
        if self._t.raw_files and not self._t.file_compression:
            q: Dict[str, Any] = {"sandbox": self._id, "path": path}
            if offset:
                q["offset"] = offset
            if length:
                q["length"] = length
            try:
                return raw_read(self._t, q, op=f"read {path}")
            except NoRawRoute:
                self._t.raw_files = False
        req: Dict[str, Any] = {"sandbox": self._id, "path": path}
        if offset:
            req["offset"] = offset
        if length:
            req["length"] = length
        return self._t.data_stream(
            _SERVICE, "ReadFile", req, _proto.READ_FILE_REQUEST, op=f"read {path}", compress=True
        )

    def iter_read(self, path: str, offset: int = 0, length: int = 0) -> Iterator[bytes]:
        """Yield a file's content in chunks as they arrive.

        Args:
            offset: where to start reading.
            length: how many bytes to read (0: to the end).
        """
        with self._read_stream(path, offset, length) as stream:
            for data in stream:
                yield bytes(data)

    def read(self, path: str, offset: int = 0, length: int = 0) -> bytes:
        """Return a file's content (or ``length`` bytes of it from ``offset``).

        Raises:
            NotFoundError: the file does not exist.
        """
        out = io.BytesIO()
        with self._read_stream(path, offset, length) as stream:
            for data in stream:
                out.write(data)
        return out.getvalue()

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Return a file's content decoded as text."""
        return self.read(path).decode(encoding, errors)

    def download_file(self, remote_path: str, local: Union[str, "os.PathLike[str]", IO[bytes]]) -> int:
        """Copy a file of the sandbox to ``local``: a path (written to a
        temporary file beside it and renamed into place when complete) or a
        binary file object open for writing (written from where it is;
        its ``write()`` gets memoryviews of a reused buffer, as io's do).
        The bytes stream through that one buffer: a file of any size takes
        little memory. Returns its size."""
        if not isinstance(local, (str, os.PathLike)):
            with self._read_stream(remote_path, 0, 0) as stream:
                return stream.copy_to(local)
        local_path = os.fspath(local)
        n = 0
        tmp = local_path + ".sbx-partial"
        try:
            with open(tmp, "wb") as f, self._read_stream(remote_path, 0, 0) as stream:
                for data in stream:
                    # Holes of a sparse file arrive as zeros: keep them holes.
                    if _all_zero(data):
                        f.seek(len(data), os.SEEK_CUR)
                    else:
                        f.write(data)
                    n += len(data)
                f.truncate()
            os.replace(tmp, local_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return n

    # -- writing -------------------------------------------------------------

    @staticmethod
    def _source(data: Data) -> Any:
        if isinstance(data, str):
            return data.encode("utf-8")
        if isinstance(data, (bytes, bytearray, memoryview)) or hasattr(data, "read"):
            return data
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
        src = self._source(data)
        size = _raw_size(src)
        if size is not None and size >= RAW_UPLOAD_MIN and self._t.raw_files and not self._t.file_compression:
            q: Dict[str, Any] = {"sandbox": self._id, "path": path, "mode": format(mode & 0o7777, "o")}
            if append:
                q["append"] = "1"
            if not make_parents:
                q["parents"] = "0"
            try:
                return raw_write(self._t, q, src, size, op=f"write {path}")
            except NoRawRoute:
                # An old daemon answered before reading the body: fall back
                # (a file object is where it was; sendfile leaves its offset).
                self._t.raw_files = False
        header: Dict[str, Any] = {"sandbox": self._id, "path": path, "mode": mode}
        if append:
            header["append"] = True
        if make_parents:
            header["makeParents"] = True
        resp = self._t.upload_stream(
            _SERVICE, "WriteFile", header, src,
            _proto.WRITE_FILE_REQUEST, _proto.WRITE_FILE_RESPONSE, op=f"write {path}", compress=True,
        )
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
        self._t.unary(_SERVICE, "Rename", req, op=f"rename {src} -> {dst}")

    # -- directories as tar --------------------------------------------------

    def upload_tar(self, remote_dir: str, tar: Union[bytes, IO[bytes]]) -> Dict[str, int]:
        """Extract a tar stream (bytes or binary file) into ``remote_dir``
        (created if missing). Returns ``{"files": n, "bytes": n}``."""

        resp = self._t.upload_stream(
            _SERVICE, "UploadTar", {"sandbox": self._id, "path": remote_dir}, self._source(tar),
            _proto.UPLOAD_TAR_REQUEST, _proto.UPLOAD_TAR_RESPONSE, op=f"upload tar to {remote_dir}", compress=True,
        )
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
        with self._t.data_stream(
            _SERVICE, "DownloadTar", req, _proto.DOWNLOAD_TAR_REQUEST, op=f"download {remote_path}",
            compress=True,
        ) as stream:
            for data in stream:
                yield bytes(data)

    def download_tar(self, remote_path: str) -> bytes:
        """Return a tar of ``remote_path`` (a directory's contents, or one file)."""
        out = io.BytesIO()
        req = {"sandbox": self._id, "path": remote_path}
        with self._t.data_stream(
            _SERVICE, "DownloadTar", req, _proto.DOWNLOAD_TAR_REQUEST, op=f"download {remote_path}",
            compress=True,
        ) as stream:
            for data in stream:
                out.write(data)
        return out.getvalue()

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
