"""Codebases: the ignore walker against the vectors shared with the Go SDK,
then upload, mount into two sandboxes, sync, conflicts and delete against a
real daemon."""

from __future__ import annotations

import io
import json
import os
import tarfile
from typing import Dict

import pytest

import sbx
from sbx.codebase import walk_codebase

from conftest import unique

VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "codebase_ignore.json")


def _cases():
    with open(VECTORS) as f:
        return json.load(f)["cases"]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_walk_vectors(case, tmp_path) -> None:
    for rel, content in case["files"].items():
        full = tmp_path.joinpath(*rel.rstrip("/").split("/"))
        if rel.endswith("/"):
            full.mkdir(parents=True, exist_ok=True)
            continue
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(content)
    max_bytes = case.get("max_file_bytes") or sbx.codebase.DEFAULT_MAX_FILE_BYTES
    files, skipped = walk_codebase(
        tmp_path, ignore=case.get("extra") or [], include_git=not case.get("no_git"), max_file_bytes=max_bytes
    )
    got = sorted(rel for rel, st in files if not os.path.isdir(tmp_path / rel) or os.path.islink(tmp_path / rel))
    assert got == case["included"]
    assert sorted(s.path for s in skipped) == sorted(case.get("skipped") or [])


def _tar_files(data: bytes) -> Dict[str, bytes]:
    out: Dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            if m.isreg():
                f = tf.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


def test_codebase_lifecycle(client: sbx.Client, make_sandbox, tmp_path) -> None:
    (tmp_path / ".gitignore").write_text("*.log\n")
    (tmp_path / "app.py").write_text("print('v1')\n")
    (tmp_path / "debug.log").write_text("noise")
    (tmp_path / "huge.bin").write_bytes(b"x" * 5000)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n")
    name = unique("cb")
    cb = client.codebases.from_local(tmp_path, name=name, ignore=["pkg/*.pyc"], max_file_bytes=1000)
    assert cb.id.startswith("cb-") and cb.name == name
    assert cb.file_count == 3  # .gitignore, app.py, pkg/mod.py
    assert [s.path for s in cb.skipped] == ["huge.bin"]
    assert client.codebases.get(name).id == cb.id
    assert cb.id in [c.id for c in client.codebases.list()]
    files = _tar_files(client.codebases.download(name))
    assert files["app.py"] == b"print('v1')\n" and "debug.log" not in files

    a = make_sandbox(codebases=[name])
    b = make_sandbox(codebases=[(name, "/code")])
    assert a.run("cat /workspace/app.py").stdout == "print('v1')\n"
    a.run("echo \"print('A')\" > /workspace/app.py && echo n > /workspace/pkg/new.py", raise_on_error=True)
    assert b.run("cat /code/app.py").stdout == "print('v1')\n"

    with pytest.raises(sbx.FailedPreconditionError):
        client.codebases.delete(name)

    res = a.sync_codebase()
    assert sorted(res.written) == ["app.py", "pkg/new.py"] and res.revision == 2 and not res.conflicts
    assert _tar_files(client.codebases.download(cb.id))["app.py"] == b"print('A')\n"

    b.run("echo \"print('B')\" > /code/app.py", raise_on_error=True)
    dry = b.sync_codebase(dry_run=True)
    assert [c.path for c in dry.conflicts] == ["app.py"]
    res = client.codebases.sync(b.id, "/code")
    assert [c.path for c in res.conflicts] == ["app.py"] and res.revision == 2 and not res.written
    assert _tar_files(client.codebases.download(cb.id))["app.py"] == b"print('A')\n"
    with pytest.raises(sbx.FailedPreconditionError):
        b.terminate(sync_codebases=True)
    res = b.sync_codebase(force=True)
    assert res.revision == 3
    assert _tar_files(client.codebases.download(cb.id))["app.py"] == b"print('B')\n"

    a.terminate()
    b.terminate(sync_codebases=True)
    client.codebases.delete(name)
    with pytest.raises(sbx.NotFoundError):
        client.codebases.get(name)


def test_guarded_codebase_mount(client: sbx.Client, make_sandbox, tmp_path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('app')\n")
    (tmp_path / ".env").write_text("TOKEN=x\n")
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / ".keep").write_text("")
    name = unique("guardcb")
    cb = client.codebases.from_local(tmp_path, name=name)
    try:
        sb = make_sandbox(codebases=[sbx.CodebaseMount(cb.name, preset="agent-safe",
                                                       rules=[sbx.PermissionRule("*.log", "none")])])
        r = sb.run("cd /workspace; ls -A; cat .env; echo x >> src/app.py; echo ok > output/r.txt && cat output/r.txt")
        assert r.stdout == "output\nsrc\nok\n", r
        assert "No such file" in r.stderr and "Permission denied" in r.stderr
        assert [p.path for p in sb.refresh().info.path_policies] == ["/workspace"]
        sb.terminate()
    finally:
        client.codebases.delete(cb.name)
