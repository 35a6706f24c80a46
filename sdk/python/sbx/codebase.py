"""Codebases: file trees uploaded once and mounted into many sandboxes,
each sandbox writing into its own copy-on-write layer: ``client.codebases``.

Ignore rules are applied here, on the client, so ignored files never leave
this machine. They follow gitignore(5), with the same semantics (and the same
test vectors, ``sdk/testdata/codebase_ignore.json``) as the Go SDK:

* ``.gitignore`` and ``.sandboxignore`` files in every directory (a deeper
  file wins over a shallower one; in one directory ``.sandboxignore`` wins
  over ``.gitignore``), then the ``ignore`` patterns given here, anchored at
  the root and winning over every file; the last matching rule decides;
* ``#`` comments, ``!`` negation, ``dir/`` (directories only), ``/anchored``,
  ``*``, ``?``, ``[a-z]``, ``**/``, ``/**``, ``/**/``; a file inside an
  excluded directory cannot be re-included;
* an ignore file is read only if it is a regular file of the tree of at most
  1 MiB (never through a symlink, not even one to a file inside the tree, as
  git reads them): anything else (``.gitignore -> /etc/shadow``, a FIFO)
  raises :class:`~sbx.IgnoreFileError` naming it, before it is opened;
* ``.git`` is uploaded unless ``include_git=False`` (so that ``git`` works
  in the sandbox); files larger than ``max_file_bytes`` are skipped and
  reported, as are sockets, FIFOs and devices.

Example::

    cb = client.codebases.from_local("./myproject", name="myproject")
    print(cb.file_count, [s.path for s in cb.skipped])
    with client.create(codebases=["myproject"]) as sb:     # at /workspace
        sb.run("cd /workspace && make test")
        result = sb.sync_codebase()                          # write changes back
        print(result.written, result.conflicts)
"""

from __future__ import annotations

import io
import os
import re
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _proto
from ._tar import _BY_FD, MAX_IGNORE_FILE_BYTES, IgnoreFileError, ReplacedFileError, open_walked, read_ignore_file
from ._transport import ChunkStream, Transport
from .types import PathPolicy, PermissionRule

__all__ = [
    "Codebase",
    "CodebaseMount",
    "Codebases",
    "SkippedFile",
    "SyncConflict",
    "SyncResult",
    "DEFAULT_MAX_FILE_BYTES",
    "IgnoreFileError",
    "MAX_IGNORE_FILE_BYTES",
    "walk_codebase",
]

_SERVICE = "sbx.v1.CodebaseService"

#: Files larger than this are skipped unless told otherwise (10 MiB).
DEFAULT_MAX_FILE_BYTES = 10 << 20


@dataclass(frozen=True)
class SkippedFile:
    """A file an upload left out."""

    path: str
    size_bytes: int = 0
    reason: str = ""

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "SkippedFile":
        return cls(path=obj.get("path", ""), size_bytes=int(obj.get("sizeBytes") or 0), reason=obj.get("reason", ""))

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"path": self.path, "reason": self.reason}
        if self.size_bytes:
            out["sizeBytes"] = str(self.size_bytes)
        return out


@dataclass(frozen=True)
class Codebase:
    """A codebase as the daemon describes it."""

    id: str
    name: str = ""
    revision: int = 0
    file_count: int = 0
    size_bytes: int = 0
    created_at_ms: int = 0
    updated_at_ms: int = 0
    #: Ids of live sandboxes mounting it.
    sandboxes: List[str] = field(default_factory=list)
    #: What the upload left out.
    skipped: List[SkippedFile] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Codebase":
        return cls(
            id=obj.get("id", ""),
            name=obj.get("name", ""),
            revision=int(obj.get("revision") or 0),
            file_count=int(obj.get("fileCount") or 0),
            size_bytes=int(obj.get("sizeBytes") or 0),
            created_at_ms=int(obj.get("createdAtMs") or 0),
            updated_at_ms=int(obj.get("updatedAtMs") or 0),
            sandboxes=list(obj.get("sandboxes") or []),
            skipped=[SkippedFile.from_json(s) for s in obj.get("skipped") or []],
        )

    def mount(
        self, path: str = "", *, preset: str = "view-only", rules: Sequence[PermissionRule] = (), default: str = ""
    ) -> "CodebaseMount":
        """A mount of this codebase at ``path`` (default ``/workspace``) for
        ``Sandbox.create(codebases=[...])``, guarded by ``preset`` (default
        ``"view-only"``; ``""`` with no rules mounts it unguarded: fully
        writable in the sandbox's copy-on-write layer)."""
        return CodebaseMount(self.id, path, preset=preset, rules=list(rules), default=default)


@dataclass(frozen=True)
class SyncConflict:
    """A path the codebase changed after the sandbox's base revision."""

    path: str
    reason: str = ""


@dataclass(frozen=True)
class SyncResult:
    """What a sync wrote (or, with ``dry_run``, would write)."""

    codebase: str
    revision: int
    written: List[str] = field(default_factory=list)
    deleted: List[str] = field(default_factory=list)
    #: Not empty and not forced: nothing was written.
    conflicts: List[SyncConflict] = field(default_factory=list)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "SyncResult":
        return cls(
            codebase=obj.get("codebase", ""),
            revision=int(obj.get("revision") or 0),
            written=list(obj.get("written") or []),
            deleted=list(obj.get("deleted") or []),
            conflicts=[SyncConflict(c.get("path", ""), c.get("reason", "")) for c in obj.get("conflicts") or []],
        )


# -- ignore rules -------------------------------------------------------------


class _Rule:
    __slots__ = ("base", "regex", "negate", "dir_only")

    def __init__(self, base: str, regex: "re.Pattern[str]", negate: bool, dir_only: bool) -> None:
        self.base = base
        self.regex = regex
        self.negate = negate
        self.dir_only = dir_only


def _compile(line: str, base: str) -> Optional[_Rule]:
    """Compile one gitignore line (``None`` for blanks and comments)."""
    line = line.rstrip("\r")
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    if not line or line.startswith("#"):
        return None
    negate = False
    if line.startswith("!"):
        negate, line = True, line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    if line.startswith("/"):
        line = line[1:]
    out = ["^"]
    if not anchored:
        out.append("(?:.*/)?")
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "*":
            if i + 1 < n and line[i + 1] == "*" and (i == 0 or line[i - 1] == "/"):
                if i + 2 == n:
                    out.append(".*")
                    i += 2
                    continue
                if line[i + 2] == "/":
                    out.append("(?:.*/)?")
                    i += 3
                    continue
            while i + 1 < n and line[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < n and line[j] in "!^":
                j += 1
            if j < n and line[j] == "]":
                j += 1
            while j < n and line[j] != "]":
                j += 1
            if j >= n:
                out.append("\\[")
                i += 1
                continue
            cls = line[i + 1 : j]
            if cls[:1] in ("!", "^"):
                cls = "^" + cls[1:]
            cls = cls.replace("\\", "\\\\").replace("[", "\\[")
            out.append("[" + cls + "]")
            i = j
        elif c == "\\":
            if i + 1 < n:
                i += 1
                out.append(re.escape(line[i]))
        else:
            out.append(re.escape(c))
        i += 1
    out.append("$")
    return _Rule(base, re.compile("".join(out), re.DOTALL), negate, dir_only)


class _Matcher:
    def __init__(self, rules: List[_Rule], extra: List[_Rule]) -> None:
        self.rules = rules
        self.extra = extra

    def child(self, abs_dir: str, rel_dir: str, dir_fd: Optional[int] = None) -> "_Matcher":
        add: List[_Rule] = []
        for name in (".gitignore", ".sandboxignore"):
            text = read_ignore_file(abs_dir, name, rel_dir + "/" + name if rel_dir else name, dir_fd)
            if text is None:
                continue
            for line in text.split("\n"):
                r = _compile(line, rel_dir)
                if r is not None:
                    add.append(r)
        if not add:
            return self
        return _Matcher(self.rules + add, self.extra)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        ign = False
        for rules in (self.rules, self.extra):
            for r in rules:
                if r.dir_only and not is_dir:
                    continue
                p = rel
                if r.base:
                    if not rel.startswith(r.base + "/"):
                        continue
                    p = rel[len(r.base) + 1 :]
                if r.regex.match(p):
                    ign = not r.negate
        return ign


def walk_codebase(
    path: Union[str, "os.PathLike[str]"],
    *,
    ignore: Sequence[str] = (),
    max_file_bytes: Optional[int] = DEFAULT_MAX_FILE_BYTES,
    include_git: bool = True,
    use_ignore_files: bool = True,
) -> Tuple[List[Tuple[str, os.stat_result]], List[SkippedFile]]:
    """What :meth:`Codebases.from_local` would upload from ``path``: a list of
    ``(relative path, lstat result)`` (parents before children) and the
    skipped files."""
    root = os.fspath(path)
    if not os.path.isdir(root):
        raise NotADirectoryError(root)
    extra = [r for r in (_compile(p, "") for p in ignore) if r is not None]
    files: List[Tuple[str, os.stat_result]] = []
    skipped: List[SkippedFile] = []

    # The directory may be reshaped while it is walked (a cloned repository's
    # scripts, a tree a sandbox shares): where the OS allows, each directory
    # is opened from its parent's handle with O_NOFOLLOW and must be the one
    # just listed, so one swapped for a symlink is never listed (and its
    # outside names never sent); _write_tar then reads only walked files.
    by_fd = _BY_FD

    def walk(abs_dir: str, rel_dir: str, m: _Matcher, fd: Optional[int]) -> None:
        if use_ignore_files:
            m = m.child(abs_dir, rel_dir, fd)
        with os.scandir(fd if fd is not None else abs_dir) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = e.name if not rel_dir else rel_dir + "/" + e.name
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if rel == ".git" and is_dir and not include_git:
                continue
            if m.ignored(rel, is_dir):
                continue
            if is_dir:
                files.append((rel, st))
                sub = os.path.join(abs_dir, e.name)
                if fd is None:
                    walk(sub, rel, m, None)
                    continue
                try:
                    dfd = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as err:
                    raise ReplacedFileError(f"{rel}: replaced during the walk ({err.strerror}); not read") from None
                try:
                    now = os.fstat(dfd)
                    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                        raise ReplacedFileError(f"{rel}: replaced by another directory during the walk; not read")
                    walk(sub, rel, m, dfd)
                finally:
                    os.close(dfd)
            elif stat.S_ISREG(st.st_mode):
                if max_file_bytes and st.st_size > max_file_bytes:
                    skipped.append(SkippedFile(rel, st.st_size, f"larger than {max_file_bytes} bytes"))
                    continue
                files.append((rel, st))
            elif stat.S_ISLNK(st.st_mode):
                files.append((rel, st))
            else:
                skipped.append(SkippedFile(rel, 0, "not a regular file, directory or symlink"))

    if not by_fd:  # pragma: no cover - not POSIX
        walk(root, "", _Matcher([], extra), None)
        return files, skipped
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walk(root, "", _Matcher([], extra), root_fd)
    finally:
        os.close(root_fd)
    return files, skipped


def _write_tar(root: str, files: List[Tuple[str, os.stat_result]], out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for rel, st in files:
            full = os.path.join(root, *rel.split("/"))
            ti = tarfile.TarInfo(rel)
            ti.mode = stat.S_IMODE(st.st_mode)
            ti.mtime = int(st.st_mtime)
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            if stat.S_ISDIR(st.st_mode):
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif stat.S_ISLNK(st.st_mode):
                ti.type = tarfile.SYMTYPE
                ti.linkname = os.readlink(full)
                tf.addfile(ti)
            else:
                ti.size = st.st_size
                # The very file walked: not one swapped for a link since.
                with open_walked(root, rel, st) as f:
                    tf.addfile(ti, f)


class Codebases:
    """Upload, list, download, delete and sync codebases. Obtain it as
    :attr:`Client.codebases`."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def from_local(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        name: Optional[str] = None,
        ignore: Sequence[str] = (),
        max_file_bytes: Optional[int] = DEFAULT_MAX_FILE_BYTES,
        include_git: bool = True,
        use_ignore_files: bool = True,
    ) -> Codebase:
        """Upload the directory ``path`` as a new codebase and return it; its
        ``skipped`` lists every file left out for size or type (ignored files
        are not listed). ``max_file_bytes=None`` means no per-file limit.

        Raises:
            AlreadyExistsError: ``name`` is taken.
            InvalidArgumentError: a bad name, or the daemon refused the tree.
        """
        root = os.fspath(path)
        files, skipped = walk_codebase(
            root, ignore=ignore, max_file_bytes=max_file_bytes, include_git=include_git,
            use_ignore_files=use_ignore_files,
        )
        with tempfile.SpooledTemporaryFile(max_size=16 << 20) as spool:
            _write_tar(root, files, spool)
            spool.seek(0)

            header: Dict[str, Any] = {"skipped": [s.to_json() for s in skipped]}
            if name:
                header["name"] = name
            if max_file_bytes:
                header["maxFileBytes"] = max_file_bytes
            resp = self._t.upload_stream(
                _SERVICE, "CreateCodebase", header, spool,  # type: ignore[arg-type]
                _proto.CREATE_CODEBASE_REQUEST, _proto.CREATE_CODEBASE_RESPONSE, op=f"create codebase from {root}",
            )
        cb = Codebase.from_json(resp.get("codebase") or {})
        all_skipped = [SkippedFile.from_json(s) for s in resp.get("skipped") or []]
        return Codebase(**{**cb.__dict__, "skipped": all_skipped or cb.skipped})

    def list(self) -> List[Codebase]:
        """Every codebase, oldest first."""
        resp = self._t.unary(_SERVICE, "ListCodebases", {}, op="list codebases")
        return [Codebase.from_json(c) for c in resp.get("codebases") or []]

    def get(self, ref: str) -> Codebase:
        """Describe one codebase by id or name.

        Raises:
            NotFoundError: no such codebase.
        """
        resp = self._t.unary(_SERVICE, "GetCodebase", {"codebase": ref}, op=f"get codebase {ref}")
        return Codebase.from_json(resp.get("codebase") or {})

    def iter_download(self, ref: str) -> Iterator[bytes]:
        """Yield the current revision as a tar, in chunks."""
        with self._stream(ref) as stream:
            for data in stream:
                yield bytes(data)

    def _stream(self, ref: str) -> ChunkStream:
        return self._t.data_stream(
            _SERVICE, "DownloadCodebase", {"codebase": ref}, _proto.DOWNLOAD_CODEBASE_REQUEST,
            op=f"download codebase {ref}",
        )

    def download(self, ref: str, dest: Union[str, "os.PathLike[str]", IO[bytes], None] = None) -> Union[bytes, int]:
        """The current revision as a tar: returned as bytes, or written to
        ``dest`` (a path or a binary file; then the byte count is returned)."""
        if dest is None:
            out = io.BytesIO()
            with self._stream(ref) as stream:
                for data in stream:
                    out.write(data)
            return out.getvalue()
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "wb") as f:
                return self.download(ref, f)
        with self._stream(ref) as stream:
            return stream.copy_to(dest)

    def delete(self, ref: str) -> None:
        """Delete a codebase.

        Raises:
            FailedPreconditionError: a sandbox mounts it.
        """
        self._t.unary(_SERVICE, "DeleteCodebase", {"codebase": ref}, op=f"delete codebase {ref}")

    def sync(self, sandbox: str, path: Optional[str] = None, *, dry_run: bool = False, force: bool = False) -> SyncResult:
        """Write the changes ``sandbox`` made under its codebase mount at
        ``path`` (default: its only one) back into the codebase. Conflicts
        (paths the codebase changed after the sandbox's base) are listed in
        the result; unless ``force``, nothing is written then."""
        req: Dict[str, Any] = {"sandbox": sandbox}
        if path:
            req["path"] = path
        if dry_run:
            req["dryRun"] = True
        if force:
            req["force"] = True
        resp = self._t.unary(_SERVICE, "SyncCodebase", req, op=f"sync codebase of {sandbox}")
        return SyncResult.from_json(resp)


#: The preset of a guarded codebase mount that names neither a preset nor a
#: default permission.
GUARDED_DEFAULT_PRESET = "view-only"


def mounts_to_json(codebases: Sequence[Any]) -> List[Dict[str, Any]]:
    """Turn ``"name"``, ``"name:/path"``, ``"name:/path:preset"``,
    ``("name", "/path")``, a :class:`CodebaseMount` or ``{"codebase": ...,
    "path": ...}`` into CodebaseMount JSON."""
    out: List[Dict[str, Any]] = []
    for cb in codebases:
        if isinstance(cb, CodebaseMount):
            out.append(cb.to_json())
            continue
        if isinstance(cb, Codebase):
            out.append({"codebase": cb.id})
            continue
        preset = ""
        if isinstance(cb, str):
            parts = cb.split(":")
            if not parts[0] or len(parts) > 3:
                raise ValueError(f"codebase mount {cb!r}: want NAME[:/path[:PRESET]]")
            name = parts[0]
            path = parts[1] if len(parts) > 1 else ""
            preset = parts[2] if len(parts) > 2 else ""
        elif isinstance(cb, Mapping):
            name, path = str(cb.get("codebase", "")), str(cb.get("path", ""))
            preset = str(cb.get("preset", ""))
        else:
            name, path = cb
        m: Dict[str, Any] = {"codebase": name}
        if path:
            m["path"] = path
        if preset:
            m["preset"] = preset
        out.append(m)
    return out


@dataclass(frozen=True)
class CodebaseMount:
    """Mount codebase ``codebase`` at ``path`` (default ``/workspace``),
    optionally guarded by permission rules: ``preset`` (e.g.
    ``"agent-safe"``), extra ``rules`` and a ``default`` permission, as in
    :class:`~sbx.PathPolicy`.

    Without any of the three the mount is unguarded: fully writable (in the
    sandbox's own copy-on-write layer). A guarded mount (``rules``) with
    neither ``preset`` nor ``default`` starts from ``"view-only"`` (names
    and metadata, no content): its rules open what the agent may read or
    write, AgentFense's default. (The daemon alone would start from
    ``write``.)"""

    codebase: str
    path: str = ""
    preset: str = ""
    rules: List[PermissionRule] = field(default_factory=list)
    default: str = ""

    def to_json(self) -> Dict[str, Any]:
        preset = self.preset
        if self.rules and not preset and not self.default:
            preset = GUARDED_DEFAULT_PRESET
        pol = PathPolicy(self.path or "/workspace", preset=preset, rules=list(self.rules), default=self.default).to_json()
        m: Dict[str, Any] = {"codebase": self.codebase}
        if self.path:
            m["path"] = self.path
        for key in ("preset", "rules", "defaultPermission"):
            if pol.get(key):
                m[key] = pol[key]
        return m
