"""Test fixtures: a real sbx daemon for the SDK to talk to.

With ``$SBX_ADDR`` set (and a daemon answering there), the tests use that
daemon. Otherwise a session
fixture starts ``bin/sbx serve`` (built by ``make build`` in the repository
root) on a free loopback port with a temporary data directory and no warm
pool, and stops it afterwards. The daemon needs root: without root (and
without ``$SBX_ADDR``) every daemon test is skipped with that reason.

Every sandbox a test creates carries the label ``sbx-pytest=<run id>`` and is
destroyed at the end of the session even if a test leaked it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Callable, Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(SDK_DIR))
SBX_BIN = os.path.join(REPO, "bin", "sbx")

sys.path.insert(0, SDK_DIR)

import sbx  # noqa: E402

RUN_ID = uuid.uuid4().hex[:12]
LABEL = "sbx-pytest"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(addr: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _mounted_under(path: str) -> bool:
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1].startswith(real + "/") for line in f if len(line.split()) > 1)
    except OSError:
        return True


@pytest.fixture(scope="session")
def daemon_addr() -> Iterator[str]:
    """The address of a running daemon (started here unless $SBX_ADDR is set)."""
    env_addr = os.environ.get("SBX_ADDR")
    if env_addr:
        if _healthy(env_addr):
            yield env_addr
            return
        # E.g. the Makefile's default address with no daemon running there.
        print(f"\nSBX_ADDR={env_addr}: no daemon answers; starting one for the tests", file=sys.stderr)
    if os.geteuid() != 0:
        pytest.skip("the sbx daemon needs root (namespaces, cgroups, mounts): run as root or set SBX_ADDR")
    if not os.access(SBX_BIN, os.X_OK):
        pytest.skip(f"{SBX_BIN} is missing: run `make build` in {REPO} first (or set SBX_ADDR)")
    data_dir = tempfile.mkdtemp(prefix="sbx-pytest-")
    os.chmod(data_dir, 0o711)  # sandbox roots must be reachable by the mapped uids
    addr = f"127.0.0.1:{_free_port()}"
    log_path = os.path.join(data_dir, "daemon.log")
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [SBX_BIN, "serve", "--listen", addr, "--data-dir", os.path.join(data_dir, "data"), "--warm-pool", "0",
         "--network=false"],  # tests leave the host's bridges and firewall alone
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _healthy(addr):
            if proc.poll() is not None:
                log.flush()
                pytest.fail(f"the daemon exited ({proc.returncode}):\n{open(log_path).read()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"the daemon did not come up in 30s:\n{open(log_path).read()[-4000:]}")
            time.sleep(0.1)
        yield addr
    finally:
        # Sandboxes outlive the daemon: destroy them all before stopping it.
        if proc.poll() is None:
            try:
                client = sbx.Client(addr, timeout=60)
                for sb in sbx.Sandbox.list(client=client):
                    try:
                        sb.terminate()
                    except sbx.SbxError:
                        pass
            except sbx.SbxError:
                pass
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()
        if os.environ.get("SBX_PYTEST_KEEP_LOG"):
            print(f"daemon log: {log_path}", file=sys.stderr)
        elif not _mounted_under(data_dir):
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def client(daemon_addr: str) -> Iterator[sbx.Client]:
    """A client of the test daemon. Destroys this run's sandboxes at the end."""
    c = sbx.Client(daemon_addr, timeout=120)
    yield c
    for sb in sbx.Sandbox.list(labels={LABEL: RUN_ID}, client=c):
        try:
            sb.terminate()
        except sbx.SbxError:
            pass


@pytest.fixture
def make_sandbox(client: sbx.Client) -> Iterator[Callable[..., sbx.Sandbox]]:
    """A factory of sandboxes (labelled for cleanup) destroyed after the test."""
    made: List[sbx.Sandbox] = []

    def make(**kwargs: object) -> sbx.Sandbox:
        labels = dict(kwargs.pop("labels", None) or {})  # type: ignore[call-overload]
        labels[LABEL] = RUN_ID
        kwargs.setdefault("memory", "256M")
        kwargs.setdefault("timeout", 600)
        sb = sbx.Sandbox.create(labels=labels, client=client, **kwargs)  # type: ignore[arg-type]
        made.append(sb)
        return sb

    yield make
    for sb in made:
        try:
            sb.terminate()
        except sbx.SbxError:
            pass


@pytest.fixture(scope="module")
def shared_sandbox(client: sbx.Client) -> Iterator[sbx.Sandbox]:
    """One sandbox shared by the tests of a module (they must not break it)."""
    sb = sbx.Sandbox.create(labels={LABEL: RUN_ID}, memory="256M", timeout=900, client=client)
    yield sb
    try:
        sb.terminate()
    except sbx.SbxError:
        pass


def unique(prefix: str) -> str:
    """A sandbox name unique to this run."""
    return f"{prefix}-{RUN_ID[:6]}-{uuid.uuid4().hex[:6]}"
