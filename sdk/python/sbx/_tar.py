"""Tar helpers: packing a local directory and extracting a downloaded archive
safely (no absolute paths, no ``..``, no symlinks leaving the destination --
those are skipped and reported --, no writing through a symlink of the same
archive, no device nodes or FIFOs, no setuid bits, no ownership taken from
the archive)."""

from __future__ import annotations

import copy
import errno
import os
import stat
import tarfile
from typing import IO, Callable, Iterator, List, Optional, Tuple, Union

__all__ = [
    "pack_dir", "safe_extract", "open_walked", "read_ignore_file", "walk_tree", "IgnoreFileError", "UnsafeArchiveError",
    "ReplacedFileError", "MAX_IGNORE_FILE_BYTES",
]


class UnsafeArchiveError(ValueError):
    """A tar entry would escape the destination or is of a forbidden kind."""


#: Whether directories can be walked and files opened by handle (POSIX).
_BY_FD = os.scandir in os.supports_fd and os.open in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW")


class ReplacedFileError(OSError):
    """A file of a directory being packed is no longer the one the walk saw
    (it, or a directory above it, became a symlink or another file)."""


def open_walked(root: str, rel: str, st: os.stat_result) -> IO[bytes]:
    """Open the regular file ``rel`` (slash-separated, relative to ``root``)
    for reading, but only the very file a walk saw (``st``: its lstat).

    A directory packed for upload may be shaped by someone else (a cloned
    repository, a tree a sandbox shares) while it is read. Opening by path
    would follow a file or directory swapped for a symlink since the walk
    and send what it leads to (``~/.ssh/id_rsa``). Here each component is
    opened from ``root`` with ``O_NOFOLLOW`` (a symlink anywhere fails) and
    the file must have ``st``'s device and inode.

    Raises:
        ReplacedFileError: the file or a directory above it changed.
    """
    parts = rel.split("/")
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if _BY_FD:
        dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                try:
                    nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | nofollow, dir_fd=dirfd)
                except OSError as e:
                    raise ReplacedFileError(f"{rel}: {part!r} replaced during the walk ({e.strerror}); not read") from None
                os.close(dirfd)
                dirfd = nfd
            try:
                # O_NONBLOCK: a FIFO swapped in must not block the open.
                fd = os.open(parts[-1], os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | nofollow, dir_fd=dirfd)
            except OSError as e:
                raise ReplacedFileError(f"{rel}: replaced during the walk ({e.strerror}); not read") from None
        finally:
            os.close(dirfd)
        f = os.fdopen(fd, "rb")
    else:  # pragma: no cover - not POSIX: the inode check alone
        f = open(os.path.join(root, *parts), "rb")
    now = os.fstat(f.fileno())
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        f.close()
        raise ReplacedFileError(f"{rel}: replaced by another file during the walk; not read")
    return f


#: The most bytes an ignore file (.gitignore, .sandboxignore, .dockerignore) may hold.
MAX_IGNORE_FILE_BYTES = 1 << 20


class IgnoreFileError(ValueError):
    """An ignore file of a directory being uploaded is not one the SDK reads:
    not a regular file (a symlink, a FIFO, a device), or too large."""


def read_ignore_file(abs_dir: str, name: str, rel: str, dir_fd: Optional[int] = None) -> Optional[str]:
    """The text of the ignore file ``name`` of the directory ``abs_dir``
    (open as ``dir_fd`` when given), or ``None`` when there is none.

    The walker opens it for its own reasons, and the tree may be hostile (a
    cloned repository's ``.gitignore -> /etc/shadow``, ``-> /dev/zero``, a
    FIFO): it is opened without following a symlink (git reads its ignore
    files with ``O_NOFOLLOW`` too) and without blocking, must be a regular
    file and hold at most :data:`MAX_IGNORE_FILE_BYTES`.

    Raises:
        IgnoreFileError: it is anything else. Quietly dropping its rules
            could upload what they were meant to keep out.
    """
    def refuse(kind: str) -> IgnoreFileError:
        return IgnoreFileError(
            f"read {rel}: is {kind}; ignore files are read only when they are regular files "
            "(replace it with a copy, or pass use_ignore_files=False)"
        )

    def kind_of(mode: int) -> str:
        if stat.S_ISLNK(mode):
            return "a symlink"
        if stat.S_ISDIR(mode):
            return "a directory"
        return "a FIFO" if stat.S_ISFIFO(mode) else "a special file"

    path: Union[str, int] = name if dir_fd is not None else os.path.join(abs_dir, name)
    try:
        # Looked at before it is opened: a device is never opened at all.
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise refuse(kind_of(st.st_mode))
    if st.st_size > MAX_IGNORE_FILE_BYTES:
        raise IgnoreFileError(f"read {rel}: {st.st_size} bytes, more than the {MAX_IGNORE_FILE_BYTES} an ignore file may hold")
    # O_NOFOLLOW and O_NONBLOCK: one swapped for a symlink or a FIFO since
    # is refused, not followed or waited on.
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise refuse("a symlink") from None
        raise
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise IgnoreFileError(f"read {rel}: replaced during the walk; not read")
        data = f.read(MAX_IGNORE_FILE_BYTES + 1)
    if len(data) > MAX_IGNORE_FILE_BYTES:
        raise IgnoreFileError(f"read {rel}: grew past the {MAX_IGNORE_FILE_BYTES} bytes an ignore file may hold")
    return data.decode("utf-8", errors="surrogateescape")


def walk_tree(top: str) -> Iterator[Tuple[str, List[str], List[str]]]:
    """``os.walk(top)`` (top-down; prune by editing the directory list), but
    where the OS allows through ``os.fwalk``: each directory is entered by
    a handle from its parent's and only if it is the very directory its
    ``lstat`` saw, so one swapped for a symlink during the walk is not
    entered and the names of what it leads to are never listed."""
    if _BY_FD:
        for root, dirs, files, _ in os.fwalk(top):
            yield root, dirs, files
    else:  # pragma: no cover - not POSIX
        yield from os.walk(top)


def pack_dir(local_dir: str, out: IO[bytes]) -> int:
    """Write a tar of the *contents* of ``local_dir`` to ``out`` (entries named
    relative to it). Symlinks are archived as links, never followed; a file
    is read only if it is still the one the walk saw (:func:`open_walked`).
    Returns the number of entries."""
    count = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for root, dirs, files in walk_tree(local_dir):
            dirs.sort()
            rel_root = os.path.relpath(root, local_dir)
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(root, name)
                arc = name if rel_root == "." else os.path.join(rel_root, name)
                arc = arc.replace(os.sep, "/")
                try:
                    st = os.lstat(path)
                    ti = tf.gettarinfo(path, arcname=arc)
                except OSError:
                    continue
                if ti is None or not (ti.isreg() or ti.isdir() or ti.issym()):
                    continue  # sockets, devices, fifos: not archived
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                if ti.isreg():
                    with open_walked(local_dir, arc, st) as f:
                        if os.fstat(f.fileno()).st_size != ti.size:
                            raise ReplacedFileError(f"{arc}: changed size while being packed")
                        tf.addfile(ti, f)
                else:
                    tf.addfile(ti)
                count += 1
    return count


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _climbs_after_name(target: str) -> bool:
    """Whether a link target has a ".." after a name ("s/x/.."): it climbs
    from wherever s/x leads, and a later member can make s/x a link
    ("s/x -> .." turns "l -> s/x/.." into the destination's parent after
    l's check passed). Leading ".."s climb through the link's own parent
    directories, which are never links, so they resolve as they read."""
    named = False
    for part in target.replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if named:
                return True
        else:
            named = True
    return False


class _SkipLink(Exception):
    """A symlink whose target leaves the destination: not created."""


def _check_member(member: tarfile.TarInfo, dest_real: str) -> tarfile.TarInfo:
    """Validate one member against what is already on disk; return a sanitised
    copy. Raises UnsafeArchiveError, or _SkipLink for a symlink leaving the
    destination."""
    name = member.name
    if not name or name.startswith("/") or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"{name!r}: absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise UnsafeArchiveError(f"{name!r}: contains '..'")
    if member.isdev() or member.isfifo() or not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveError(f"{name!r}: device nodes, FIFOs and other special files are not allowed")
    target = os.path.realpath(os.path.join(dest_real, name))
    if not _inside(dest_real, target):
        raise UnsafeArchiveError(f"{name!r}: leaves the destination")
    if member.issym():
        link = member.linkname
        if not link or os.path.isabs(link) or _climbs_after_name(link):
            raise _SkipLink()
        resolved = os.path.realpath(os.path.join(os.path.dirname(os.path.join(dest_real, name)), link))
        if not _inside(dest_real, resolved):
            raise _SkipLink()
    elif member.islnk():
        link = member.linkname
        if os.path.isabs(link) or ".." in link.replace("\\", "/").split("/"):
            raise UnsafeArchiveError(f"{name!r}: hard link target {link!r} leaves the destination")
        resolved = os.path.realpath(os.path.join(dest_real, link))
        if not _inside(dest_real, resolved):
            raise UnsafeArchiveError(f"{name!r}: hard link target {link!r} leaves the destination")
    m = copy.copy(member)
    m.uid, m.gid = os.getuid(), os.getgid()
    m.uname = m.gname = ""
    # No setuid/setgid/sticky, no group/other write; the owner can always
    # read and write (and enter directories).
    if m.isreg() or m.islnk():
        m.mode = (m.mode & 0o755) | 0o600
    elif m.isdir():
        m.mode = (m.mode & 0o755) | 0o700
    return m


class _SparseTarFile(tarfile.TarFile):
    """A TarFile that writes blocks of zeros as holes: a sandbox's sparse
    file (say 2 GiB of holes from a 64 MiB box) arrives as zeros in the tar
    and must not become 2 GiB on the client's disk."""

    def makefile(self, tarinfo, targetpath):  # type: ignore[override]
        if tarinfo.sparse is not None:
            return super().makefile(tarinfo, targetpath)
        source = self.fileobj
        source.seek(tarinfo.offset_data)
        remaining = tarinfo.size
        with open(targetpath, "wb") as target:
            while remaining > 0:
                chunk = source.read(min(_BLOCK, remaining))
                if not chunk:
                    raise tarfile.ReadError("unexpected end of data")
                if chunk.count(0) == len(chunk):
                    target.seek(len(chunk), os.SEEK_CUR)
                else:
                    target.write(chunk)
                remaining -= len(chunk)
            target.truncate()


_BLOCK = 64 << 10


def safe_extract(fileobj: IO[bytes], dest: str, *, on_entry: Optional[Callable[[str], None]] = None,
                 skipped: Optional[List[str]] = None) -> int:
    """Extract a tar stream into ``dest`` (created if missing), refusing unsafe
    entries. Uses :func:`tarfile.data_filter` where Python has it (3.12, and
    security releases of 3.9-3.11), plus the checks above. Symlinks whose
    target leaves ``dest`` (absolute, or climbing out with ``..``) are not
    created; each is appended to ``skipped`` as ``"name -> target"``.
    Symlinks that stay inside are kept. Returns the number of entries
    extracted.

    Raises:
        UnsafeArchiveError: on the first unsafe entry (earlier entries stay),
            an entry below a symlink of the same archive among them.
    """
    os.makedirs(dest, exist_ok=True)
    dest_real = os.path.realpath(dest)
    has_filter = hasattr(tarfile, "data_filter")
    count = 0
    # Stream mode: entries are processed in order, so links created by earlier
    # entries are on disk when later ones are checked with realpath().
    links = set()  # symlinks this archive created
    with _SparseTarFile.open(fileobj=fileobj, mode="r|*") as tf:
        for member in tf:
            norm = os.path.normpath(member.name.replace("\\", "/")).replace(os.sep, "/")
            parts = norm.split("/")
            for i in range(1, len(parts)):
                parent = "/".join(parts[:i])
                if parent in links:
                    raise UnsafeArchiveError(
                        f"{member.name!r}: below {parent!r}, a symlink of the same archive; refusing to write through it")
            try:
                m = _check_member(member, dest_real)
            except _SkipLink:
                if skipped is not None:
                    skipped.append(f"{member.name} -> {member.linkname}")
                continue
            # Replace, never write through, a link of this archive.
            if norm in links and not m.isdir():
                os.unlink(os.path.join(dest_real, norm))
                links.discard(norm)
            elif norm in links:
                raise UnsafeArchiveError(f"{member.name!r}: a directory over a symlink of the same archive")
            if has_filter:
                try:
                    filtered = tarfile.data_filter(m, dest_real)  # type: ignore[attr-defined]
                except tarfile.FilterError as e:  # type: ignore[attr-defined]
                    raise UnsafeArchiveError(str(e)) from e
                if filtered is None:
                    continue
                m = filtered
                tf.extract(m, dest_real, set_attrs=True, filter="fully_trusted")  # type: ignore[call-arg]
            else:
                tf.extract(m, dest_real, set_attrs=True)
            if m.issym():
                links.add(norm)
            count += 1
            if on_entry is not None:
                on_entry(m.name)
    return count
