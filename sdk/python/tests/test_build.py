"""Builder recipes through the Python SDK, against a real daemon. The base is
a snapshot of a host-image sandbox, so no network is needed."""

from __future__ import annotations

import pytest

import sbx
from conftest import unique


def test_recipe_validation(tmp_path) -> None:
    with pytest.raises(ValueError):
        sbx.Recipe("")
    with pytest.raises(ValueError):
        sbx.Recipe().apt_install()
    with pytest.raises(ValueError):
        sbx.Recipe().run("  ")
    with pytest.raises(FileNotFoundError):
        sbx.Recipe().copy_local(tmp_path / "missing", "/x")
    with pytest.raises(ValueError):
        sbx.Recipe.from_dict({"from": "host", "steps": [{"run": "a", "env": {}}]})
    r = sbx.Recipe("host").run("true").env(A="1")
    assert r.to_json() == {"from": "host", "steps": [{"run": "true"}, {"env": {"env": {"A": "1"}}}]}
    assert sbx.Recipe.from_dict(r.to_json()).to_json() == r.to_json()


def test_build_and_cache(client: sbx.Client, make_sandbox, tmp_path) -> None:
    base_sb = make_sandbox()
    base_sb.run("mkdir -p /opt/base && echo base > /opt/base/marker", raise_on_error=True)
    base = f"localhost/pytest/{unique('base')}:v1"
    base_sb.snapshot(base)
    app = tmp_path / "app"
    app.mkdir()
    (app / "main.py").write_text("print('hello from the image')\n")
    tag = f"localhost/pytest/{unique('built')}:v1"
    recipe = (
        sbx.Recipe(base)
        .env(GREETING="hi")
        .copy_local(app, "/app")
        .workdir("/app")
        .run("echo $GREETING > /app/greeting && cat /opt/base/marker >> /app/greeting")
    )
    events = []
    try:
        img = client.images.build(recipe, tag, progress=events.append)
        assert img.ref == tag and img.digest.startswith("sha256:")
        assert "GREETING=hi" in img.config.env and img.config.workdir == "/app"
        phases = [e.step.get("phase") for e in events if e.kind == "step"]
        assert "done" in phases
        sb = make_sandbox(image=tag)
        assert sb.run("python3 main.py; cat greeting").stdout == "hello from the image\nhi\nbase\n"
        # The same recipe again comes from the cache.
        events.clear()
        again = client.images.build(recipe, tag, progress=events.append)
        assert again.digest == img.digest
        assert all(e.step.get("phase") == "cached" for e in events if e.kind == "step")
        # A failing step names itself.
        with pytest.raises(sbx.SbxError) as ei:
            client.images.build(sbx.Recipe(base).run("echo boom >&2; exit 3"), "")
        assert "boom" in str(ei.value) or "exit" in str(ei.value)
    finally:
        for ref in (tag, base):
            try:
                client.images.remove(ref)
            except sbx.SbxError:
                pass


def test_dockerignore_and_pack_context(tmp_path) -> None:
    import io
    import tarfile

    from sbx._dockerctx import DockerIgnore, pack_context

    files = {
        ".dockerignore": "# junk\nnode_modules\n**/*.pyc\n/secret.env\ndocs/*\n!docs/keep.md\n",
        "app.py": "x",
        "node_modules/pkg/i.js": "x",
        "src/deep/x.pyc": "x",
        "src/mod.py": "x",
        "secret.env": "TOKEN=1",
        "docs/a.md": "x",
        "docs/keep.md": "x",
        "sub/secret.env": "kept: only the root one is listed",
    }
    for name, body in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body)
    (tmp_path / "passwd-link").symlink_to("/etc/passwd")
    data = pack_context(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        got = sorted(
            m.name + (" -> " + m.linkname if m.issym() else "") for m in tf.getmembers() if m.isreg() or m.issym()
        )
    assert got == [
        ".dockerignore",
        "app.py",
        "docs/keep.md",
        "passwd-link -> /etc/passwd",
        "src/mod.py",
        "sub/secret.env",
    ]
    assert DockerIgnore("a/**/b\n").excluded("a/x/y/b")
    assert not DockerIgnore("*.py\n").excluded("sub/x.py")  # anchored at the root


def test_build_dockerfile(client: sbx.Client, make_sandbox, tmp_path) -> None:
    base_sb = make_sandbox()
    base = f"localhost/pytest/{unique('dfbase')}:v1"
    base_sb.snapshot(base)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hello from a Dockerfile')\n")
    (tmp_path / "app" / "junk.pyc").write_text("x")
    (tmp_path / ".dockerignore").write_text("**/*.pyc\n")
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE\nFROM $BASE\nARG WHO=nobody\nENV GREETING=hi\nWORKDIR /app\nCOPY app/ ./\n"
        'RUN echo "$GREETING from $WHO" > greeting\nCMD ["python3", "main.py"]\n'
    )
    tag = f"localhost/pytest/{unique('df')}:v1"
    assert client.images.ensure("host") is None
    assert client.images.ensure(base).digest.startswith("sha256:")  # stored: no pull
    try:
        img = client.images.build(
            tag=tag, dockerfile=tmp_path / "Dockerfile", build_args={"BASE": base, "WHO": "pytest"}
        )
        assert img.ref == tag and img.config.cmd == ["python3", "main.py"] and img.config.workdir == "/app"
        sb = make_sandbox(image=tag)
        out = sb.run("python3 main.py; cat greeting; test -e junk.pyc || echo ignored").stdout
        assert out == "hello from a Dockerfile\nhi from pytest\nignored\n"
        # llm-sandbox style: create straight from the Dockerfile.
        sb2 = make_sandbox(dockerfile=tmp_path / "Dockerfile", build_args={"BASE": base, "WHO": "create"})
        assert sb2.run("cat greeting").stdout == "hi from create\n"
        assert "sbx-dockerfile/" in sb2.info.image
        (tmp_path / "Dockerfile").write_text(f"FROM {base}\nRUN true\nHEALTHCHECK CMD true\n")
        with pytest.raises(sbx.InvalidArgumentError) as ei:
            client.images.build(tag=tag, dockerfile=tmp_path / "Dockerfile")
        assert "line 3: HEALTHCHECK is not supported" in str(ei.value)
    finally:
        for ref in (tag, base):
            try:
                client.images.remove(ref)
            except sbx.SbxError:
                pass
