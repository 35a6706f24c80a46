"""Named volumes and snapshots through the Python SDK, against a real daemon."""

from __future__ import annotations

import asyncio

import pytest

import sbx
from conftest import unique


def test_volume_mount_parse() -> None:
    assert sbx.VolumeMount.parse("data:/data") == sbx.VolumeMount("data", "/data")
    assert sbx.VolumeMount.parse("data:/data:ro").read_only
    for bad in ("data", ":/x", "data:/x:rx", "a:b:c:d"):
        with pytest.raises(ValueError):
            sbx.VolumeMount.parse(bad)


def test_volume_lifecycle_and_sharing(client: sbx.Client, make_sandbox) -> None:
    name = unique("vol")
    vol = client.volumes.create(name, size="64M")
    try:
        assert vol.name == name
        assert vol.size == 64 << 20
        assert name in [v.name for v in client.volumes.list()]
        with pytest.raises(sbx.AlreadyExistsError):
            client.volumes.create(name)
        writer = make_sandbox(volumes=[f"{name}:/data"])
        assert writer.info.volumes == [{"volume": name, "path": "/data"}]
        writer.run("echo persisted > /data/f", raise_on_error=True)
        reader = make_sandbox(volumes=[sbx.VolumeMount(name, "/mnt/v", read_only=True)])
        assert reader.run("cat /mnt/v/f").stdout == "persisted\n"
        r = reader.run("echo x > /mnt/v/g")
        assert r.exit_code != 0 and "Read-only" in r.stderr
        got = client.volumes.get(name)
        assert sorted(got.sandboxes) == sorted([writer.id, reader.id])
        assert got.used > 0
        with pytest.raises(sbx.FailedPreconditionError):
            client.volumes.remove(name)
        writer.terminate()
        reader.terminate()
        # The data outlives the sandboxes.
        again = make_sandbox(volumes=[f"{name}:/data"])
        assert again.run("cat /data/f").stdout == "persisted\n"
        again.terminate()
    finally:
        try:
            client.volumes.remove(name)
        except sbx.NotFoundError:
            pass
    with pytest.raises(sbx.NotFoundError):
        client.volumes.get(name)


def test_volume_bad_input(client: sbx.Client, make_sandbox) -> None:
    with pytest.raises(sbx.InvalidArgumentError):
        client.volumes.create("no/slashes")
    with pytest.raises(sbx.NotFoundError):
        make_sandbox(volumes=[f"{unique('missing')}:/data"])
    with pytest.raises(TypeError):
        make_sandbox(volumes=[42])


def test_async_volumes(client: sbx.Client) -> None:
    from sbx.aio import AsyncClient

    async def main() -> None:
        ac = AsyncClient(client=client)
        name = unique("avol")
        await ac.volumes.create(name)
        assert name in [v.name for v in await ac.volumes.list()]
        await ac.volumes.remove(name)

    asyncio.run(main())


def test_snapshot_then_create_from_it(client: sbx.Client, make_sandbox) -> None:
    sb = make_sandbox()
    sb.run("mkdir -p /opt/app && echo built > /opt/app/marker", raise_on_error=True)
    tag = f"localhost/pytest/{unique('snap')}:v1"
    img = sb.snapshot(tag)
    try:
        assert img.ref == tag and img.digest.startswith("sha256:")
        child = make_sandbox(image=tag)
        assert child.run("cat /opt/app/marker").stdout == "built\n"
        child.terminate()
    finally:
        client.images.remove(tag)
