"""The examples run against the test daemon."""

from __future__ import annotations

import os
import subprocess
import sys

import sbx

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def _run(name: str, addr: str) -> str:
    env = dict(os.environ, SBX_ADDR=addr, PYTHONPATH=os.path.dirname(HERE))
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"{name} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_quickstart(daemon_addr: str) -> None:
    out = _run("quickstart.py", daemon_addr)
    assert "42" in out
    assert "tick 3" in out
    assert "timed out: True" in out
    assert "downloaded out.txt: 42" in out
    assert "error code: not_found" in out
    assert out.rstrip().endswith("destroyed")


def test_reward_loop(daemon_addr: str, client: sbx.Client) -> None:
    out = _run("reward_loop.py", daemon_addr)
    scores = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and "/" in parts[2]:
            try:
                scores[parts[0]] = float(parts[1])
            except ValueError:
                pass
    assert scores["correct"] == 1.0
    assert scores["infinite_loop"] == 0.0
    assert scores["syntax_error"] == 0.0
    assert 0 < scores["forgets_case"] < 1
    assert scores["tries_to_cheat"] < 1
    assert "best: correct" in out
    # Every candidate's sandbox was destroyed.
    assert sbx.Sandbox.list(labels={"example": "reward_loop"}, client=client) == []
