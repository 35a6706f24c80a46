"""Handles that found a sandbox do not own it; ``sb.open`` file objects;
``Sandbox.from_local`` with a view-only default; the async API's code,
sessions, codebases, logs and files."""

from __future__ import annotations

import asyncio
import io
import os

import pytest

import sbx
from conftest import LABEL, RUN_ID, unique
from sbx.aio import AsyncClient, AsyncSandbox


def test_reconnect_does_not_destroy(client: sbx.Client) -> None:
    with sbx.Sandbox.create(labels={LABEL: RUN_ID}, memory="128M", client=client) as owner:
        assert owner.owned
        for found in (
            sbx.Sandbox.from_id(owner.id, client=client),
            sbx.Sandbox.from_name(owner.id, client=client),
            client.get(owner.id),
            sbx.Sandbox.list(labels={LABEL: RUN_ID}, client=client)[0],
        ):
            assert not found.owned
            with found as sb:
                assert sb.run("echo alive").stdout == "alive\n"
            # Leaving the block of a handle that did not create it leaves it running.
            assert owner.refresh().state == "running"
        sid = owner.id
    # The creator's block ends it.
    with pytest.raises(sbx.NotFoundError):
        client.get(sid)


def test_open(shared_sandbox: sbx.Sandbox) -> None:
    sb = shared_sandbox
    p = f"/tmp/{unique('open')}/f.txt"
    with sb.open(p, "w") as f:
        assert f.write("héllo\n") == 6
        f.write("second\n")
    assert sb.files.read(p) == "héllo\nsecond\n".encode()
    with sb.open(p) as f:
        assert f.readline() == "héllo\n"
        assert list(f) == ["second\n"]
    with sb.open(p, "a") as f:
        f.write("third\n")
        f.flush()  # sent now, appended
        assert sb.files.read_text(p).endswith("third\n")
        f.write("fourth\n")
    assert sb.files.read_text(p) == "héllo\nsecond\nthird\nfourth\n"
    with sb.open(p, "rb") as f:
        assert f.read(5) == "héll".encode()
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    with sb.open(p, "r+b") as f:
        f.seek(0)
        f.write(b"H")
    assert sb.files.read(p).startswith("Héllo".encode())
    blob = os.urandom(100_000)
    with sb.open(p + ".bin", "wb") as f:
        f.write(blob)
    assert sb.files.read(p + ".bin") == blob
    with pytest.raises(FileExistsError):
        sb.open(p, "x")
    with pytest.raises(sbx.NotFoundError):
        sb.open(p + ".missing")
    with pytest.raises(ValueError):
        sb.open(p, "rw")
    with sb.open(p, "w") as f:
        pass  # w truncates at open, like open()
    assert sb.files.read(p) == b""


def test_from_local_view_only(client: sbx.Client, tmp_path: "os.PathLike[str]") -> None:
    src = str(tmp_path)
    with open(os.path.join(src, "app.py"), "w") as f:
        f.write("print('app')\n")
    with sbx.Sandbox.from_local(src, labels={LABEL: RUN_ID}, memory="128M", client=client) as sb:
        ls = sb.run("ls /workspace")
        assert ls.stdout == "app.py\n"  # names are visible
        cat = sb.run("cat /workspace/app.py")
        assert cat.exit_code != 0 and "Permission denied" in cat.stderr  # content is not
        w = sb.run("echo x > /workspace/new.py")
        assert w.exit_code != 0
        names = {c.id for c in client.codebases.list()}
        assert len(names) >= 1
        owned = list(sb._own_codebases)
    # The sandbox ends, then its codebase.
    for cid in owned:
        with pytest.raises(sbx.NotFoundError):
            client.codebases.get(cid)

    # Rules alone start from view-only too; preset="" is unguarded.
    cb = client.codebases.from_local(src, name=unique("guarded"))
    try:
        rule = sbx.PermissionRule("app.py", "read")
        with sbx.Sandbox.create(labels={LABEL: RUN_ID}, memory="128M", client=client,
                                codebases=[sbx.CodebaseMount(cb.id, "/w", rules=[rule])]) as sb:
            assert sb.run("cat /w/app.py").stdout == "print('app')\n"
            assert sb.run("touch /w/other").exit_code != 0
        with sbx.Sandbox.create(labels={LABEL: RUN_ID}, memory="128M", client=client,
                                codebases=[cb.mount("/w", preset="")]) as sb:
            assert sb.run("echo x > /w/new.py && cat /w/new.py").stdout == "x\n"
    finally:
        client.codebases.delete(cb.id)


def test_async_parity_live(client: sbx.Client, tmp_path: "os.PathLike[str]") -> None:
    async def main() -> None:
        ac = AsyncClient(client=client)
        assert ac.addr == client.addr
        async with await AsyncSandbox.create(labels={LABEL: RUN_ID}, memory="256M", client=ac,
                                             command=["sh", "-c", "echo out; echo err >&2"]) as sb:
            assert sb.owned
            r = await sb.run_code("print(6*7)")
            assert r.stdout == "42\n" and r.exit_code == 0
            async with await sb.create_context("python") as ctx:
                await ctx.run("x = 41")
                r = await sb.run_code("print(x + 1)", context=ctx)
                assert r.stdout == "42\n"
                assert [c.id for c in await sb.list_contexts()] == [ctx.id]
            async with await sb.session() as ss:
                await ss.exec("cd /tmp && export V=7")
                assert (await ss.exec("echo $PWD $V")).stdout == "/tmp 7\n"
                assert [s.id for s in await sb.list_sessions()] == [ss.id]
            st = await sb.wait()
            assert st.exit_code == 0
            assert await sb.returncode() == 0
            assert [line async for line in sb.stdout] == ["out\n"]
            logs = await (await sb.logs()).read()
            assert logs == {"stdout": b"out\n", "stderr": b"err\n"}
            async with await sb.open("/tmp/a.txt", "w") as f:
                await f.write("async file\n")
            async with await sb.open("/tmp/a.txt") as f:
                assert await f.read() == "async file\n"
            chunks = [c async for c in sb.files.iter_read("/tmp/a.txt")]
            assert b"".join(chunks) == b"async file\n"

            # A second handle on the same box does not own it.
            async with await AsyncSandbox.from_id(sb.id, client=ac) as other:
                assert not other.owned
            assert (await sb.refresh()).state == "running"

        src = str(tmp_path)
        with open(os.path.join(src, "m.py"), "w") as f:
            f.write("M = 1\n")
        cb = await ac.codebases.from_local(src, name=unique("aio"))
        assert (await ac.codebases.get(cb.id)).file_count == 1
        assert cb.id in [c.id for c in await ac.codebases.list()]
        await ac.codebases.delete(cb.id)

    asyncio.run(main())


def test_errors_name_things_once(client: sbx.Client, shared_sandbox: sbx.Sandbox) -> None:
    """Representative failures of the SDK read without a repeated segment
    (the SDK's op and the daemon's message used to say the same thing)."""
    sb = shared_sandbox
    calls = {
        "read": lambda: sb.files.read("/nope"),
        "stat": lambda: sb.files.stat("/nope"),
        "list": lambda: sb.files.list("/nope"),
        "remove": lambda: sb.files.remove("/nope"),
        "mkdir": lambda: sb.files.mkdir("/nope/a", parents=False),
        "rename": lambda: sb.files.rename("/nope", "/x"),
        "download_tar": lambda: sb.files.download_tar("/nope"),
        "upload_tar": lambda: sb.files.upload_tar("/etc/hostname", b""),
        "run_code": lambda: sb.run_code("x", "cobol"),
        "codebase": lambda: client.codebases.get("nope"),
        "volume": lambda: client.volumes.get("nope"),
        "image": lambda: client.images.get("nope"),
        "tag": lambda: client.images.tag("nope", "x"),
        "snapshot": lambda: sb.snapshot("BAD REF"),
        "create image": lambda: sbx.Sandbox.create(image="nope/nope:1", client=client),
    }
    for name, call in calls.items():
        with pytest.raises(sbx.SbxError) as info:
            call()
        segs = str(info.value).split(": ")
        repeats = [s for a, s in zip(segs, segs[1:]) if a == s]
        assert not repeats, f"{name}: {info.value} repeats {repeats}"
        assert str(info.value).count(sb.id) <= 1, f"{name}: {info.value} names the sandbox twice"
        assert str(info.value).count("/nope ") + str(info.value).count("/nope:") <= 1, f"{name}: {info.value}"
