"""Sandbox lifecycle: create, find, list by label, stop/start, cleanup, errors."""

from __future__ import annotations

import pytest

import sbx
from conftest import LABEL, RUN_ID, unique


def test_version(client: sbx.Client) -> None:
    v = client.version()
    assert v.get("version")
    assert any(r.get("isDefault") for r in v.get("runtimes", []))


def test_create_get_and_properties(make_sandbox) -> None:
    name = unique("props")
    sb = make_sandbox(name=name, labels={"team": "ml"}, env={"FOO": "bar"}, memory="300M", cpu=0.5,
                      pids=128, timeout=600, workdir="/root/work")
    assert sb.id.startswith("sb-")
    assert sb.name == name
    assert sb.state == "running"
    assert sb.labels["team"] == "ml"
    assert sb.labels[LABEL] == RUN_ID
    info = sb.info
    assert info.resources.memory_bytes == 300 << 20
    assert info.resources.cpu == 0.5
    assert info.resources.pids == 128
    assert info.timeout == 600
    assert info.env == {"FOO": "bar"}
    assert info.workdir == "/root/work"
    assert info.created_at is not None and info.expires_at is not None

    by_id = sbx.Sandbox.from_id(sb.id, client=sb.client)
    by_name = sbx.Sandbox.from_name(name, client=sb.client)
    assert by_id == sb and by_name == sb
    assert by_name.id == sb.id
    # Finding a sandbox does not measure it (GetSandbox noStats): no stats
    # until asked for.
    assert by_name.info.stats is None

    st = sb.stats
    assert st.pids >= 1
    assert st.memory_bytes > 0
    assert sb.refresh() is sb
    assert sb.run("echo $FOO; pwd").stdout == "bar\n/root/work\n"
    assert sb.id in repr(sb)


def test_secrets_are_not_returned(make_sandbox) -> None:
    sb = make_sandbox(secrets={"API_KEY": "s3cret"})
    assert sb.refresh().info.secret_names == ["API_KEY"]
    assert "s3cret" not in str(sb.info.raw)
    assert sb.run("echo $API_KEY").stdout.strip() == "s3cret"


def test_list_by_labels_and_selectors(client: sbx.Client, make_sandbox) -> None:
    tag = unique("lst")
    a = make_sandbox(labels={"grp": tag, "role": "a"})
    b = make_sandbox(labels={"grp": tag, "role": "b"})
    ids = lambda xs: sorted(s.id for s in xs)  # noqa: E731
    assert ids(sbx.Sandbox.list(labels={"grp": tag}, client=client)) == sorted([a.id, b.id])
    assert ids(sbx.Sandbox.list(labels={"grp": tag, "role": "a"}, client=client)) == [a.id]
    assert ids(sbx.Sandbox.list(selectors=[f"grp={tag}", "role!=a"], client=client)) == [b.id]
    assert ids(client.list(labels={"grp": tag}, selectors=["!role"])) == []
    assert ids(client.list(labels={"grp": None}, selectors=[f"grp={tag}"])) == sorted([a.id, b.id])
    assert a.id in ids(sbx.Sandbox.list(client=client))


def test_default_client_uses_sbx_addr(daemon_addr: str, make_sandbox, monkeypatch) -> None:
    monkeypatch.setenv("SBX_ADDR", daemon_addr)
    sb = make_sandbox()
    found = sbx.Sandbox.from_id(sb.id)  # no client: $SBX_ADDR
    assert found.client.addr == daemon_addr


def test_stop_and_start(make_sandbox) -> None:
    sb = make_sandbox()
    sb.files.write("/root/keep.txt", "kept")
    p = sb.exec("sh", "-c", "echo $$ > /root/pid; sleep 300")
    try:
        sb.stop()
        assert sb.state == "stopped"
        assert sb.refresh().state == "stopped"
        with pytest.raises(sbx.SbxError) as ei:
            sb.run("true")
        assert ei.value.code in ("failed_precondition", "unavailable")
        sb.start()
        assert sb.state == "running"
        assert sb.run("cat /root/keep.txt").stdout == "kept"
        # The background process survived the freeze.
        r = sb.run("kill -0 $(cat /root/pid) && echo alive")
        assert r.stdout.strip() == "alive"
    finally:
        p.kill()


def test_context_manager_terminates(client: sbx.Client) -> None:
    with sbx.Sandbox.create(labels={LABEL: RUN_ID}, memory="128M", client=client) as sb:
        assert sb.run("true").exit_code == 0
        sid = sb.id
    with pytest.raises(sbx.NotFoundError):
        sbx.Sandbox.from_id(sid, client=client)


def test_context_manager_terminates_on_error(client: sbx.Client) -> None:
    sid = ""
    with pytest.raises(RuntimeError):
        with client.create(labels={LABEL: RUN_ID}, memory="128M") as sb:
            sid = sb.id
            raise RuntimeError("boom")
    with pytest.raises(sbx.NotFoundError):
        client.get(sid)


def test_terminate_twice(make_sandbox) -> None:
    sb = make_sandbox()
    sb.terminate()
    with pytest.raises(sbx.NotFoundError):
        sb.terminate()
    sb.__exit__(None, None, None)  # the context manager tolerates it


def test_error_mapping(client: sbx.Client, make_sandbox) -> None:
    name = unique("dup")
    make_sandbox(name=name)
    with pytest.raises(sbx.AlreadyExistsError) as ei:
        make_sandbox(name=name)
    assert ei.value.code == "already_exists"
    assert name in ei.value.message
    assert isinstance(ei.value, sbx.SbxError)

    with pytest.raises(sbx.NotFoundError) as nf:
        sbx.Sandbox.from_id("sb-doesnotexist", client=client)
    assert nf.value.code == "not_found"
    assert "sb-doesnotexist" in str(nf.value)

    with pytest.raises(sbx.InvalidArgumentError) as ia:
        make_sandbox(memory=1)
    assert ia.value.code == "invalid_argument"
    assert ia.value.message

    with pytest.raises(sbx.InvalidArgumentError):
        make_sandbox(name="Not A Valid Name!")


def test_bad_size_is_rejected_locally() -> None:
    assert sbx.parse_size("512M") == 512 << 20
    assert sbx.parse_size("1.5G") == 3 << 29
    assert sbx.parse_size("64KiB") == 64 << 10
    assert sbx.parse_size(1234) == 1234
    with pytest.raises(ValueError):
        sbx.parse_size("lots")


def test_unreachable_daemon() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = sbx.Client(f"127.0.0.1:{port}")
    with pytest.raises(sbx.SbxConnectionError) as ei:
        c.version()
    assert ei.value.code == "unavailable"
    assert isinstance(ei.value, sbx.UnavailableError)
