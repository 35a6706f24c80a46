"""Packing a Dockerfile build context: the directory's files minus what its
``.dockerignore`` lists (docker's rules: patterns relative to the context
root, ``*`` and ``?`` do not cross ``/``, ``**`` spans directories, ``!``
re-includes, the last matching rule wins, a rule matching a directory
matches everything in it). Symlinks are packed as links, never followed, and
a file is read only if it is still the one the walk saw (``open_walked``).
The same rules as the Go SDK's ``PackContext``."""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile
from typing import List, Tuple

from ._tar import ReplacedFileError, open_walked, read_ignore_file, walk_tree

__all__ = ["MAX_CONTEXT_BYTES", "pack_context", "DockerIgnore"]

#: The largest context this SDK sends. The daemon takes 48 MiB, but this SDK
#: sends the request as JSON, the context base64-encoded (4/3 of its size),
#: and the daemon reads at most 64 MiB a message: 46 MiB leaves room for the
#: Dockerfile (at most 1 MiB) and the rest.
MAX_CONTEXT_BYTES = 46 << 20


def _pattern_regexp(p: str) -> str:
    out = []
    i = 0
    while i < len(p):
        if p.startswith("**/", i):
            out.append("(.*/)?")
            i += 3
            continue
        if p.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        c = p[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in p[i + 1 :]:
            j = p.index("]", i + 1)
            cls = p[i + 1 : j]
            if cls.startswith("!"):
                cls = "^" + cls[1:]
            out.append("[" + cls + "]")
            i = j
        elif c == "\\" and i + 1 < len(p):
            i += 1
            out.append(re.escape(p[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


class DockerIgnore:
    """Compiled ``.dockerignore`` rules."""

    def __init__(self, text: str = "") -> None:
        self.rules: List[Tuple["re.Pattern[str]", bool]] = []
        self.negations = False
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                self.negations = True
                line = line[1:].strip()
            p = posixpath.normpath(line.lstrip("/"))
            try:
                self.rules.append((re.compile("^" + _pattern_regexp(p) + "$"), negate))
            except re.error as e:
                raise ValueError(f".dockerignore line {n}: {line!r}: {e}") from None

    def excluded(self, path: str) -> bool:
        """Whether the context path ``path`` (slash-separated) is left out."""
        out = False
        for rx, negate in self.rules:
            q = path
            while q not in ("", "."):
                if rx.match(q):
                    out = not negate
                    break
                q = posixpath.dirname(q)
        return out


def pack_context(context_dir: "os.PathLike[str] | str") -> bytes:
    """A tar of ``context_dir`` for a Dockerfile build (see the module doc).

    Raises:
        ValueError: the context is larger than :data:`MAX_CONTEXT_BYTES`.
    """
    root = os.fspath(context_dir)
    # Never followed out of the context, a regular file, bounded.
    ign = DockerIgnore(read_ignore_file(root, ".dockerignore", ".dockerignore") or "")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for cur, dirs, files in walk_tree(root):
            rel = os.path.relpath(cur, root).replace(os.sep, "/")
            rel = "" if rel == "." else rel + "/"
            keep = []
            for d in sorted(dirs):
                p = rel + d
                if os.path.islink(os.path.join(cur, d)):
                    files.append(d)  # a link: packed as one, not walked
                elif not ign.excluded(p) or ign.negations:
                    keep.append(d)
            dirs[:] = keep
            for name in sorted(keep) + sorted(files):
                p = rel + name
                if ign.excluded(p):
                    continue
                full = os.path.join(cur, name)
                st = os.lstat(full)
                ti = tf.gettarinfo(full, arcname=p)
                if ti is None or not (ti.isreg() or ti.isdir() or ti.issym()):
                    continue
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                if buf.tell() + ti.size + 1024 > MAX_CONTEXT_BYTES:
                    raise ValueError(
                        f"build context {root} is more than {MAX_CONTEXT_BYTES} bytes (at {p}): "
                        "list what the build does not need in .dockerignore"
                    )
                if ti.isreg():
                    # The very file walked: not one swapped for a link since.
                    with open_walked(root, p, st) as f:
                        if os.fstat(f.fileno()).st_size != ti.size:
                            raise ReplacedFileError(f"{p}: changed size while being packed")
                        tf.addfile(ti, f)
                else:
                    tf.addfile(ti)
    return buf.getvalue()
