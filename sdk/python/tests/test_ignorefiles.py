"""Ignore files of a hostile tree: the upload walkers open .gitignore,
.sandboxignore and .dockerignore for their own reasons, so one that leads
out of the tree (``-> /etc/shadow``), blocks (a FIFO) or never ends
(``-> /dev/zero``) must be refused before it is opened, naming the file.

Each walk runs in a child process with a deadline: the old walker hung on
the FIFO and /dev/zero cases (and read the outside file), which must show
as a failure, not as a hung test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, List, Tuple

import pytest

import sbx

from conftest import SDK_DIR, unique

SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from sbx.codebase import walk_codebase
from sbx._dockerctx import pack_context
try:
    if sys.argv[3] == "docker":
        pack_context(sys.argv[2])
        print(json.dumps({"ok": True}))
    else:
        files, _ = walk_codebase(sys.argv[2])
        print(json.dumps({"ok": True, "files": [r for r, _ in files]}))
except Exception as e:
    print(json.dumps({"ok": False, "type": type(e).__name__, "msg": str(e)}))
"""


def _walk(root: str, kind: str = "codebase") -> dict:
    try:
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, SDK_DIR, root, kind], capture_output=True, text=True, timeout=15, check=True
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"walking {root} hung: it opened an ignore file that blocks or never ends")
    return json.loads(out.stdout)


def _outside(tmp_path) -> str:
    d = tmp_path / "outside"
    d.mkdir(exist_ok=True)
    p = d / "shadow"
    p.write_text("*\n")  # read and applied, it would ignore everything
    return str(p)


def _fifo(tmp_path) -> str:
    p = str(tmp_path / "fifo")
    if not os.path.exists(p):
        os.mkfifo(p)
    return p


CASES: List[Tuple[str, str, Callable, str]] = [
    ("gitignore-to-outside-file", ".gitignore", lambda tmp: os.symlink(_outside(tmp), "X"), ".gitignore: is a symlink"),
    ("gitignore-to-dev-zero", ".gitignore", lambda tmp: os.symlink("/dev/zero", "X"), ".gitignore: is a symlink"),
    ("gitignore-to-fifo", ".gitignore", lambda tmp: os.symlink(_fifo(tmp), "X"), ".gitignore: is a symlink"),
    ("sandboxignore-is-fifo", ".sandboxignore", lambda tmp: os.mkfifo("X"), ".sandboxignore: is a FIFO"),
    ("nested-gitignore-to-dev-zero", "sub/.gitignore", lambda tmp: os.symlink("/dev/zero", "X"), "sub/.gitignore: is a symlink"),
    ("gitignore-too-large", ".gitignore", lambda tmp: open("X", "w").write("#" * ((1 << 20) + 1)), "1048576"),
    ("dockerignore-to-dev-zero", ".dockerignore", lambda tmp: os.symlink("/dev/zero", "X"), ".dockerignore: is a symlink"),
    ("dockerignore-to-outside-file", ".dockerignore", lambda tmp: os.symlink(_outside(tmp), "X"), ".dockerignore: is a symlink"),
    ("dockerignore-is-fifo", ".dockerignore", lambda tmp: os.mkfifo("X"), ".dockerignore: is a FIFO"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_ignore_file_is_refused(case, tmp_path) -> None:
    _, rel, plant, want = case
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "app.py").write_text("print(1)\n")
    (root / "Dockerfile").write_text("FROM scratch\n")
    cwd = os.getcwd()
    os.chdir(root / os.path.dirname(rel) if os.path.dirname(rel) else root)
    try:
        plant(tmp_path)
        os.rename("X", os.path.basename(rel))
    finally:
        os.chdir(cwd)
    got = _walk(str(root), "docker" if rel == ".dockerignore" else "codebase")
    assert not got["ok"], f"walk succeeded with {got.get('files')}: want IgnoreFileError"
    assert got["type"] == "IgnoreFileError" and want in got["msg"], got


def test_regular_ignore_files_still_apply(tmp_path) -> None:
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".sandboxignore").write_text("secret\n")
    for p in ("a.log", "keep.py", "sub/secret", "sub/ok"):
        (tmp_path / p).write_text("x")
    files, _ = sbx.codebase.walk_codebase(tmp_path)
    got = sorted(r for r, st in files if not os.path.isdir(tmp_path / r))
    assert got == [".gitignore", "keep.py", "sub/.sandboxignore", "sub/ok"]
    # Without ignore files the hostile kind walks: a link is a link.
    os.symlink("/dev/zero", tmp_path / "sub" / ".gitignore")
    with pytest.raises(sbx.IgnoreFileError):
        sbx.codebase.walk_codebase(tmp_path)
    files, _ = sbx.codebase.walk_codebase(tmp_path, use_ignore_files=False)
    assert "sub/.gitignore" in [r for r, _ in files]


def test_from_local_refuses_before_uploading(client: sbx.Client, tmp_path) -> None:
    (tmp_path / "app.py").write_text("print(1)\n")
    os.symlink("/dev/zero", tmp_path / ".gitignore")
    name = unique("hostile")
    with pytest.raises(sbx.IgnoreFileError, match=r"\.gitignore: is a symlink"):
        client.codebases.from_local(tmp_path, name=name)
    with pytest.raises(sbx.NotFoundError):
        client.codebases.get(name)
