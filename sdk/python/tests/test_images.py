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
