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
