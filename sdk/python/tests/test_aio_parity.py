"""The asyncio API has every public method and attribute of the blocking one
(and nothing else), so that the two cannot drift apart unnoticed. Needs no
daemon."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Set

import pytest

import sbx
from sbx import aio
from sbx.code import CodeContext
from sbx.codebase import Codebases
from sbx.files import Files
from sbx.images import Images
from sbx.logs import LogLines, SandboxLogs
from sbx.process import Process
from sbx.session import Session
from sbx.tenants import Tenants
from sbx.volumes import Volumes

PAIRS = [
    (sbx.Client, aio.AsyncClient),
    (sbx.Sandbox, aio.AsyncSandbox),
    (Files, aio.AsyncFiles),
    (Images, aio.AsyncImages),
    (Volumes, aio.AsyncVolumes),
    (Codebases, aio.AsyncCodebases),
    (Tenants, aio.AsyncTenants),
    (CodeContext, aio.AsyncCodeContext),
    (Session, aio.AsyncSession),
    (Process, aio.AsyncProcess),
    (SandboxLogs, aio.AsyncLogs),
    (LogLines, aio.AsyncLogLines),
]

#: The wrapped blocking object, on every async class.
ASYNC_ONLY = {"sync"}


def public_names(cls: type) -> Set[str]:
    """Public names of the class and the attributes its ``__init__`` sets."""
    names = {n for n in dir(cls) if not n.startswith("_")}
    init = cls.__dict__.get("__init__")
    if init is not None:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    if not t.attr.startswith("_"):
                        names.add(t.attr)
    return names


@pytest.mark.parametrize("sync_cls,async_cls", PAIRS, ids=[a.__name__ for _, a in PAIRS])
def test_async_has_the_sync_api(sync_cls: type, async_cls: type) -> None:
    want = public_names(sync_cls)
    got = public_names(async_cls) - (ASYNC_ONLY - want)
    assert not want - got, f"{async_cls.__name__} lacks {sorted(want - got)} of {sync_cls.__name__}"
    assert not got - want, f"{async_cls.__name__} has {sorted(got - want)} that {sync_cls.__name__} lacks"


def test_async_methods_are_coroutines() -> None:
    """What blocks on the daemon is awaited: every public method of the async
    sandbox, client and views that the blocking one has as a plain method is
    a coroutine function, save iterators and non-blocking accessors."""
    not_coroutines = {"iter_read", "iter_download_tar", "iter_download", "kill", "poll", "close"}
    for sync_cls, async_cls in PAIRS:
        for name in public_names(sync_cls) & public_names(async_cls):
            s, a = getattr(sync_cls, name, None), getattr(async_cls, name, None)
            if not inspect.isfunction(s) or name in not_coroutines or isinstance(a, property):
                continue
            if async_cls in (aio.AsyncLogs, aio.AsyncLogLines) and name == "close":
                continue
            assert inspect.iscoroutinefunction(a) or inspect.ismethod(a), f"{async_cls.__name__}.{name} is not a coroutine"
