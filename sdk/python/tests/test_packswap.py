"""Packing a local directory for upload (codebases, upload_dir, recipe
copies, Dockerfile contexts) while someone else reshapes it: a file or a
directory swapped for a symlink to a secret outside it between the walk and
the read. The pack must fail naming the file and hold no byte of the
secret. The swap is made at the exact point between check and use."""

from __future__ import annotations

import io
import os
import shutil
import tarfile

import pytest

from sbx._dockerctx import pack_context
from sbx._tar import ReplacedFileError, pack_dir
from sbx.codebase import _write_tar, walk_codebase

SECRET = b"SECRET-OUTSIDE-THE-DIRECTORY"


def _tree(tmp_path):
    code, outside = tmp_path / "code", tmp_path / "outside"
    (code / "d").mkdir(parents=True)
    outside.mkdir()
    pad = b"x" * len(SECRET)  # as long as the secret: a size check alone passes
    (code / "f").write_bytes(pad)
    (code / "d" / "secret").write_bytes(pad)
    (outside / "secret").write_bytes(SECRET)
    return str(code), str(outside)


def _swap_file(code, outside):
    os.unlink(os.path.join(code, "f"))
    os.symlink(os.path.join(outside, "secret"), os.path.join(code, "f"))


def _swap_dir(code, outside):
    shutil.rmtree(os.path.join(code, "d"))
    os.symlink(outside, os.path.join(code, "d"))


def _swap_relative(code, outside):
    os.unlink(os.path.join(code, "d", "secret"))
    os.symlink("../../outside/secret", os.path.join(code, "d", "secret"))


def _swap_inside(code, outside):
    # A file the walk left out (ignored) read in place of a walked one.
    with open(os.path.join(code, ".env"), "wb") as f:
        f.write(SECRET)
    os.unlink(os.path.join(code, "f"))
    os.symlink(".env", os.path.join(code, "f"))


SWAPS = {
    "file": ("f", _swap_file),
    "dir": ("d/secret", _swap_dir),
    "relative link": ("d/secret", _swap_relative),
    "link to a file inside": ("f", _swap_inside),
}


@pytest.mark.parametrize("swap", SWAPS, ids=str)
def test_codebase_tar_swapped_after_walk(tmp_path, swap) -> None:
    code, outside = _tree(tmp_path)
    files, _ = walk_codebase(code, use_ignore_files=False)
    SWAPS[swap][1](code, outside)
    out = io.BytesIO()
    with pytest.raises(ReplacedFileError):
        _write_tar(code, files, out)
    assert SECRET not in out.getvalue()


def _swap_at_gettarinfo(monkeypatch, code, outside, swap):
    """Swap once, just after the packer looked at the file ``rel``."""
    rel, do = SWAPS[swap]
    orig = tarfile.TarFile.gettarinfo
    done = []

    def gettarinfo(self, name=None, arcname=None, fileobj=None):
        ti = orig(self, name, arcname, fileobj)
        if arcname == rel and not done:
            done.append(True)
            do(code, outside)
        return ti

    monkeypatch.setattr(tarfile.TarFile, "gettarinfo", gettarinfo)
    return done


@pytest.mark.parametrize("swap", SWAPS, ids=str)
def test_pack_dir_swapped_while_packing(tmp_path, monkeypatch, swap) -> None:
    code, outside = _tree(tmp_path)
    done = _swap_at_gettarinfo(monkeypatch, code, outside, swap)
    out = io.BytesIO()
    with pytest.raises(ReplacedFileError):
        pack_dir(code, out)
    assert done, "the swap was never made"
    assert SECRET not in out.getvalue()


@pytest.mark.parametrize("swap", SWAPS, ids=str)
def test_pack_context_swapped_while_packing(tmp_path, monkeypatch, swap) -> None:
    code, outside = _tree(tmp_path)
    done = _swap_at_gettarinfo(monkeypatch, code, outside, swap)
    with pytest.raises(ReplacedFileError):
        pack_context(code)  # on success it would return the tar, secret included
    assert done, "the swap was never made"


def test_codebase_walk_dir_swapped_while_walking(tmp_path, monkeypatch) -> None:
    """A directory swapped for a symlink to one outside just after the walk
    looked at it (and before listing it) must not be listed: the walk fails,
    and no name from outside is in what it would upload."""
    import sbx.codebase as cb

    code, outside = _tree(tmp_path)
    with open(os.path.join(outside, "outside-only-name"), "wb") as f:
        f.write(SECRET)
    orig = cb._Matcher.ignored
    done = []

    def ignored(self, rel, is_dir):
        got = orig(self, rel, is_dir)
        if rel == "d" and not done:
            done.append(True)
            _swap_dir(code, outside)
        return got

    monkeypatch.setattr(cb._Matcher, "ignored", ignored)
    files: list = []
    raised = False
    try:
        files, _ = walk_codebase(code, use_ignore_files=False)
    except ReplacedFileError:
        raised = True
    assert done, "the swap was never made"
    assert [rel for rel, _ in files if "outside-only-name" in rel] == []
    assert raised, "walk_codebase listed the swapped directory without an error"


@pytest.mark.parametrize("packer", ["pack_dir", "pack_context"])
def test_pack_dir_swapped_before_listing(tmp_path, monkeypatch, packer) -> None:
    """A directory swapped for a symlink to one outside after the walk made
    sure it is no link and before it lists it (os.walk: between islink and
    scandir; os.fwalk: between lstat and open): nothing of the outside
    directory, not even a name, may be packed."""
    import posixpath

    code, _ = _tree(tmp_path)
    # Only names and a link target outside: packing them reads no file, so
    # nothing fails and only the listing decides whether they go out.
    outside = str(tmp_path / "names")
    os.makedirs(os.path.join(outside, "outside-only-name"))
    os.symlink(SECRET.decode(), os.path.join(outside, "outside-link"))
    d = os.path.join(code, "d")
    done = []
    orig_islink, orig_open = posixpath.islink, os.open

    # os.walk's own islink before it lists d: pack_context asks islink(d)
    # once itself first.
    calls = []
    walk_call = 2 if packer == "pack_context" else 1

    def islink(p):
        got = orig_islink(p)
        if os.fspath(p) == d:
            calls.append(p)
        if len(calls) == walk_call and not done:
            done.append("islink")
            _swap_dir(code, outside)
        return got

    def os_open(p, flags, mode=0o777, *, dir_fd=None):
        if p == "d" and dir_fd is not None and not done:
            done.append("open")
            _swap_dir(code, outside)
        return orig_open(p, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(posixpath, "islink", islink)
    monkeypatch.setattr(os, "open", os_open)
    got = b""
    out = io.BytesIO()
    try:
        if packer == "pack_dir":
            pack_dir(code, out)
        else:
            got = pack_context(code)
    except ReplacedFileError:
        pass
    got = got or out.getvalue()
    assert done, "the swap was never made"
    assert b"outside-only-name" not in got, done
    assert b"outside-link" not in got, done
    assert SECRET not in got
