"""File objects over a sandbox's files: ``sb.open(path, mode)``.

Like Modal's ``Sandbox.open``: the object is an ordinary Python file (a
binary one, or text in a :class:`io.TextIOWrapper`), usable as a context
manager. It works on a local copy: opening for reading fetches the file,
writes go to the sandbox on ``flush()`` and ``close()`` (a whole file at
once, so it appears whole or not at all; in append mode only the new bytes,
appended).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Optional, Union

from .errors import NotFoundError

if TYPE_CHECKING:
    from .files import Files

__all__ = ["SandboxFile", "open_file", "parse_mode"]


def parse_mode(mode: str) -> "tuple[str, bool, bool]":
    """Split a mode like ``open``'s into (one of r/w/a/x, plus, binary).

    Raises:
        ValueError: a mode ``open`` would refuse too.
    """
    kinds = [c for c in mode if c in "rwax"]
    if len(kinds) != 1 or len(set(mode)) != len(mode) or any(c not in "rwaxbt+" for c in mode) or (
        "b" in mode and "t" in mode
    ):
        raise ValueError(f"invalid mode {mode!r}: want r, w, a or x, optionally with +, and b or t")
    return kinds[0], "+" in mode, "b" in mode


class SandboxFile(io.BytesIO):
    """A binary file of a sandbox, buffered locally (see the module doc)."""

    def __init__(self, files: "Files", path: str, kind: str, plus: bool, perm: int = 0o644) -> None:
        self._files = files
        self._path = path
        self._kind = kind
        self._plus = plus
        self._perm = perm
        self._dirty = False
        self._sent = 0  # append mode: bytes of the buffer already appended
        initial = b""
        if kind == "r" or (kind == "a" and plus):
            try:
                initial = files.read(path)
            except NotFoundError:
                if kind == "r":
                    raise
        elif kind == "x":
            if files.exists(path):
                raise FileExistsError(f"open {path} in the sandbox: it exists (mode x)")
        super().__init__(initial)
        if kind == "a":
            self._sent = len(initial)
            self.seek(0, io.SEEK_END)
        if kind in "wx":
            # Like open(): the file exists (empty) from here on.
            files.write(path, b"", perm)
        elif kind == "a" and not initial:
            files.write(path, b"", perm, append=True)

    @property
    def name(self) -> str:
        """The path in the sandbox."""
        return self._path

    @property
    def mode(self) -> str:
        return self._kind + ("+" if self._plus else "") + "b"

    def readable(self) -> bool:
        return self._kind == "r" or self._plus

    def writable(self) -> bool:
        return self._kind != "r" or self._plus

    def _check(self, reading: bool) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        if reading and not self.readable():
            raise io.UnsupportedOperation(f"not readable (mode {self.mode})")
        if not reading and not self.writable():
            raise io.UnsupportedOperation(f"not writable (mode {self.mode})")

    def read(self, size: Optional[int] = -1) -> bytes:
        self._check(True)
        return super().read(size)

    def read1(self, size: Optional[int] = -1) -> bytes:
        self._check(True)
        return super().read1(size if size is not None else -1)

    def readinto(self, b: Any) -> int:
        self._check(True)
        return super().readinto(b)

    def readline(self, size: Optional[int] = -1) -> bytes:
        self._check(True)
        return super().readline(size)

    def write(self, b: Any) -> int:
        self._check(False)
        if self._kind == "a":
            self.seek(0, io.SEEK_END)  # appends always go at the end
        self._dirty = True
        return super().write(b)

    def truncate(self, size: Optional[int] = None) -> int:
        self._check(False)
        if self._kind == "a":
            raise io.UnsupportedOperation("truncate in append mode")
        self._dirty = True
        return super().truncate(size)

    def flush(self) -> None:
        """Send what was written to the sandbox."""
        if self.closed or not self._dirty:
            return
        data = self.getvalue()
        if self._kind == "a":
            self._files.write(self._path, data[self._sent :], self._perm, append=True)
            self._sent = len(data)
        else:
            self._files.write(self._path, data, self._perm)
        self._dirty = False

    def close(self) -> None:
        if not self.closed:
            try:
                self.flush()
            finally:
                super().close()

    def __repr__(self) -> str:
        return f"<sbx.SandboxFile {self._path!r} mode={self.mode!r}>"


def open_file(
    files: "Files",
    path: str,
    mode: str = "r",
    *,
    encoding: Optional[str] = None,
    errors: Optional[str] = None,
    newline: Optional[str] = None,
    perm: int = 0o644,
) -> Union[SandboxFile, io.TextIOWrapper]:
    """Open ``path`` of the sandbox: a :class:`SandboxFile` in a binary mode,
    else the same in a :class:`io.TextIOWrapper` (UTF-8 unless ``encoding``)."""
    kind, plus, binary = parse_mode(mode)
    if binary and (encoding or errors or newline is not None):
        raise ValueError("binary mode takes no encoding, errors or newline")
    f = SandboxFile(files, path, kind, plus, perm)
    if binary:
        return f
    return io.TextIOWrapper(f, encoding=encoding or "utf-8", errors=errors, newline=newline, write_through=True)
