"""Images: list, get, prune and errors (pulling needs the internet: opt-in)."""

from __future__ import annotations

import os

import pytest

import sbx


def test_list_get_prune(client: sbx.Client) -> None:
    images = client.images.list()
    assert isinstance(images, list)
    assert all(isinstance(i, sbx.ImageInfo) for i in images)
    assert client.images.disk_usage() >= 0
    assert client.images.prune() >= 0
    with pytest.raises(sbx.NotFoundError):
        client.images.get("sbx-pytest-no-such-image:latest")
    with pytest.raises(sbx.SbxError):
        client.images.remove("sbx-pytest-no-such-image:latest")
    with pytest.raises(sbx.SbxError):
        client.images.export("sbx-pytest-no-such-image:latest", os.devnull)


def test_import_garbage_is_an_error(client: sbx.Client, tmp_path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tarball" * 100)
    with pytest.raises(sbx.SbxError) as ei:
        client.images.import_tar(str(bad))
    assert ei.value.code in ("invalid_argument", "internal", "unknown")


@pytest.mark.skipif(not os.environ.get("SBX_TEST_PULL"), reason="set SBX_TEST_PULL=1 to pull from a registry")
def test_pull_export_import(client: sbx.Client, tmp_path) -> None:
    events = []
    info = client.images.pull("alpine:3.20", progress=events.append)
    assert info.digest.startswith("sha256:")
    assert events and events[-1].kind == "done"
    assert any(i.ref == info.ref for i in client.images.list())
    out = tmp_path / "alpine.tar"
    assert client.images.export(info.ref, str(out)) > 0
    imported = client.images.import_tar(str(out), tag="sbx-pytest/alpine:copy")
    assert imported and imported[0].digest
    client.images.remove("sbx-pytest/alpine:copy")


def _docker_save(path, body: bytes, repo_tags) -> None:
    """A docker-save archive of a one-file image named ``repo_tags`` (which,
    as in an attacker's archive, may be anything)."""
    import hashlib
    import io
    import json
    import tarfile

    def tar_of(members) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for name, data in members:
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_of([("id", body)])
    cfg = json.dumps({"os": "linux", "architecture": "amd64", "config": {},
                      "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}).encode()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": repo_tags, "Layers": ["l/layer.tar"]}]).encode()
    path.write_bytes(tar_of([("config.json", cfg), ("l/layer.tar", layer), ("manifest.json", manifest)]))


def test_import_applies_only_the_given_tag(client: sbx.Client, tmp_path) -> None:
    victim_tar, hostile_tar = tmp_path / "victim.tar", tmp_path / "hostile.tar"
    _docker_save(victim_tar, b"victim", [])
    _docker_save(hostile_tar, b"hostile", ["sbx-pytest/victim:1", "../../evil:1"])
    victim = client.images.import_tar(str(victim_tar), tag="sbx-pytest/victim:1")[0]
    try:
        mine = client.images.import_tar(str(hostile_tar), tag="sbx-pytest/mine:1")[0]
        assert mine.ref.endswith("sbx-pytest/mine:1")
        assert client.images.get("sbx-pytest/victim:1").digest == victim.digest
        assert not any("evil" in i.ref for i in client.images.list())
        with pytest.raises(sbx.SbxError) as ei:
            client.images.import_tar(str(hostile_tar), use_archive_tags=True)
        assert ei.value.code == "invalid_argument" and "../../evil:1" in str(ei.value)
        with pytest.raises(sbx.SbxError) as ei:
            client.images.import_tar(str(hostile_tar), tag="../../evil:1")
        assert ei.value.code == "invalid_argument"
        assert client.images.get("sbx-pytest/victim:1").digest == victim.digest
    finally:
        for ref in ("sbx-pytest/victim:1", "sbx-pytest/mine:1"):
            try:
                client.images.remove(ref)
            except sbx.NotFoundError:
                pass


def test_export_import_round_trip(client: sbx.Client, tmp_path) -> None:
    # Image archives both ways through the binary codec: a layer of random
    # bytes comes back in the export byte for byte, and the export imports.
    import io
    import tarfile

    body = os.urandom((3 << 20) + 5)
    src = tmp_path / "img.tar"
    _docker_save(src, body, [])
    info = client.images.import_tar(str(src), tag="sbx-pytest/rt:1")[0]
    try:
        assert info.ref.endswith("sbx-pytest/rt:1") and info.digest.startswith("sha256:") and info.layers == 1
        out = tmp_path / "out.tar"
        n = client.images.export("sbx-pytest/rt:1", str(out))
        sink = io.BytesIO()
        assert client.images.export("sbx-pytest/rt:1", sink) == n == out.stat().st_size
        assert sink.getvalue() == out.read_bytes()
        found = False
        with tarfile.open(str(out)) as tf:
            for m in tf.getmembers():
                f = tf.extractfile(m)
                if f is None or m.size < len(body):
                    continue
                try:
                    with tarfile.open(fileobj=io.BytesIO(f.read())) as layer:
                        member = layer.extractfile("id")
                        found = found or (member is not None and member.read() == body)
                except (tarfile.TarError, KeyError):
                    continue
        assert found, "the exported archive has no layer holding the imported bytes"
        again = client.images.import_tar(io.BytesIO(sink.getvalue()), tag="sbx-pytest/rt:2")[0]
        assert again.ref.endswith("sbx-pytest/rt:2") and again.layers == 1
    finally:
        for ref in ("sbx-pytest/rt:1", "sbx-pytest/rt:2"):
            try:
                client.images.remove(ref)
            except sbx.NotFoundError:
                pass
