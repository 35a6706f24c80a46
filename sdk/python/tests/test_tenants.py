"""Tenants and TLS: a daemon started here with ``--tenants`` and
``--tls-cert``; the client trusts its private CA through ``cacert``."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from typing import Iterator, Tuple

import pytest

import sbx

from conftest import SBX_BIN, _free_port


def _hash(tok: str) -> str:
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def _make_ca(d: str) -> Tuple[str, str, str]:
    """A CA and a certificate for 127.0.0.1 it signed, with openssl."""
    ca_key, ca, key, csr, cert = (os.path.join(d, n) for n in ("ca.key", "ca.pem", "key.pem", "csr.pem", "cert.pem"))
    ext = os.path.join(d, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=sbx pytest CA")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "1", "-extfile", ext)
    return ca, cert, key


@pytest.fixture(scope="module")
def tenant_daemon() -> Iterator[Tuple[str, str, str, str, str]]:
    """(https address, CA file, acme's token, beta's token, the admin token)."""
    if os.geteuid() != 0:
        pytest.skip("the sbx daemon needs root")
    if not os.access(SBX_BIN, os.X_OK) or not shutil.which("openssl"):
        pytest.skip("needs bin/sbx (make build) and openssl")
    d = tempfile.mkdtemp(prefix="sbx-pytest-tenants-")
    os.chmod(d, 0o711)
    ca, cert, key = _make_ca(d)
    tok_a, tok_b, admin = ("sbx_" + secrets.token_hex(32) for _ in range(3))
    tenants = os.path.join(d, "tenants.json")
    with open(tenants, "w") as f:
        f.write('{"tenants": [{"name": "acme", "tokens": ["%s"]}, '
                '{"name": "beta", "tokens": ["%s"], "quotas": {"storage_bytes": 1048576}}], "admin_tokens": ["%s"]}'
                % (_hash(tok_a), _hash(tok_b), _hash(admin)))
    addr = f"127.0.0.1:{_free_port()}"
    log = open(os.path.join(d, "daemon.log"), "wb")
    proc = subprocess.Popen(
        [SBX_BIN, "serve", "--listen", addr, "--data-dir", os.path.join(d, "data"), "--warm-pool", "0",
         "--network=false", "--tenants", tenants, "--tls-cert", cert, "--tls-key", key],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = "https://" + addr
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                sbx.Client(url, token=tok_a, cacert=ca, timeout=2).version()
                break
            except sbx.SbxError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the tenant daemon did not come up:\n" + open(os.path.join(d, "daemon.log")).read()[-3000:])
                time.sleep(0.1)
        yield url, ca, tok_a, tok_b, admin
    finally:
        for tok in (tok_a, tok_b):
            try:
                for sb in sbx.Client(url, token=tok, cacert=ca, timeout=60).list():
                    sb.terminate()
            except sbx.SbxError:
                pass
        proc.terminate()
        proc.wait(20)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def test_tenants_over_tls(tenant_daemon: Tuple[str, str, str, str, str]) -> None:
    url, ca, tok_a, tok_b, _ = tenant_daemon
    a = sbx.Client(url, token=tok_a, cacert=ca, timeout=60)
    b = sbx.Client(url, token=tok_b, cacert=ca, timeout=60)
    with pytest.raises(sbx.SbxError):
        sbx.Client(url, token=tok_a, timeout=5).version()  # the private CA is not trusted by default
    with pytest.raises(sbx.UnauthenticatedError):
        sbx.Client(url, token="", cacert=ca, timeout=5).list()
    sb_a = a.create(name="dev")
    sb_b = b.create(name="dev")  # names are per tenant
    assert sb_a.id != sb_b.id
    assert sb_a.id not in [s.id for s in b.list()]
    with pytest.raises(sbx.NotFoundError) as other:
        b.get(sb_a.id)
    with pytest.raises(sbx.NotFoundError) as missing:
        b.get("sb-0000000000ff")
    assert str(other.value).replace(sb_a.id, "X") == str(missing.value).replace("sb-0000000000ff", "X")
    assert b.images.list() == []  # each tenant has an image store of its own
    assert b.codebases.list() == []  # each tenant has codebases of its own
    # Scoped tokens reach the daemon through the network gateway.
    with pytest.raises(sbx.FailedPreconditionError):
        a.create(scoped_token=True)
    assert sb_a.run("echo hi").stdout.strip() == "hi"


def test_tenant_codebases_usage_and_admin(tenant_daemon: Tuple[str, str, str, str, str], tmp_path: "os.PathLike[str]") -> None:
    url, ca, tok_a, tok_b, admin = tenant_daemon
    a = sbx.Client(url, token=tok_a, cacert=ca, timeout=60)
    b = sbx.Client(url, token=tok_b, cacert=ca, timeout=60)
    src = os.path.join(str(tmp_path), "src")
    os.mkdir(src)
    with open(os.path.join(src, "big.bin"), "wb") as f:
        f.write(b"x" * (2 << 20))
    cb = a.codebases.from_local(src, name="proj")
    assert [c.id for c in a.codebases.list()] == [cb.id]
    assert b.codebases.list() == []
    with pytest.raises(sbx.NotFoundError) as other:
        b.codebases.get("proj")
    with pytest.raises(sbx.NotFoundError) as missing:
        b.codebases.get("nope")
    assert str(other.value).replace("proj", "X") == str(missing.value).replace("nope", "X")
    # beta's storage quota is 1 MiB: a 2 MiB codebase is refused, naming it, and nothing stays.
    with pytest.raises(sbx.ResourceExhaustedError, match="storage_bytes"):
        b.codebases.from_local(src, name="proj")
    assert b.codebases.list() == []
    me = a.tenant()
    assert me.name == "acme" and me.usage.codebases == 2 << 20 and me.quotas.storage == 0
    assert b.tenant().quotas.storage == 1 << 20
    with pytest.raises(sbx.PermissionDeniedError):
        a.tenants.list()  # the admin token's alone
    adm = sbx.Client(url, token=admin, cacert=ca, timeout=60)
    assert [(t.name, t.usage.codebases) for t in adm.tenants.list()] == [("acme", 2 << 20), ("beta", 0)]
    with pytest.raises(sbx.PermissionDeniedError):
        adm.list()  # the admin token is no tenant: it sees no sandboxes
    a.codebases.delete("proj")
