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
