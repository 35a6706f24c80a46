"""Path permission rules: a guarded directory seen through its rules."""

from __future__ import annotations

import pytest

import sbx


def test_guarded_workspace(make_sandbox) -> None:
    sb = make_sandbox(path_policies=[
        sbx.PathPolicy("/workspace", preset="development", rules=[
            sbx.PermissionRule("/docs", "read", type="directory"),
        ]),
    ])
    assert sb.info.path_policies == [
        sbx.PathPolicy("/workspace", preset="development", rules=[
            sbx.PermissionRule("/docs", "read", type="directory"),
        ]),
    ]
    r = sb.run("cd /workspace && echo s > .env; echo rc=$?; echo ok > a.txt && cat a.txt && mkdir docs")
    assert "rc=0" not in r.stdout  # .env is hidden: it cannot be created
    assert "cannot create .env: Permission denied" in r.stderr
    assert "ok" in r.stdout
    assert r.exit_code != 0  # docs/ is read-only: mkdir fails
    names = [f.name for f in sb.files.list("/workspace")]
    assert names == ["a.txt"]
    with pytest.raises(sbx.SbxError):
        sb.files.write("/workspace/.env", "x")
    assert sb.files.read_text("/workspace/a.txt") == "ok\n"


def test_bad_policies_are_refused(make_sandbox) -> None:
    with pytest.raises(sbx.InvalidArgumentError):
        make_sandbox(path_policies=[sbx.PathPolicy("/workspace", preset="nope")])
    with pytest.raises(sbx.InvalidArgumentError):
        make_sandbox(path_policies=[sbx.PathPolicy("relative")])
    with pytest.raises(ValueError):
        sbx.PermissionRule("*.pem", "hidden")


def test_case_insensitive_rule(make_sandbox) -> None:
    rule = sbx.PermissionRule("*.sqlite", "none", priority=100, case_insensitive=True)
    assert sbx.PermissionRule.from_json(rule.to_json()) == rule
    sb = make_sandbox(path_policies=[sbx.PathPolicy("/workspace", preset="agent-safe", rules=[rule])])
    assert sb.info.path_policies[0].rules == [rule]
    # The preset hides secrets whatever their case; the user's rule too.
    r = sb.run("mkdir -p /workspace/output && cd /workspace/output && "
               "for f in .ENV key.PEM DB.SQLite ok.txt; do echo x > $f; done 2>/dev/null; echo $(ls -A)")
    assert r.stdout == "ok.txt\n", r.stdout + r.stderr
