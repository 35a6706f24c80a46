#!/usr/bin/env python3
"""A reward loop for code-generating agents, with sbx.

An agent (an LLM, in real life) proposes candidate solutions to a task. Each
candidate is untrusted code: it may be wrong, loop forever, crash, or try to
game the grader. We run every candidate against the task's unit tests inside
a fresh, disposable sandbox with a timeout, and turn the outcome into a
reward in [0, 1] (the fraction of tests passed) that a training or selection
loop can use.

The candidates below are fixed strings standing in for model outputs.

    SBX_ADDR=127.0.0.1:7777 PYTHONPATH=sdk/python python3 sdk/python/examples/reward_loop.py
"""

import json
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional

import sbx

TASK = "Write `solve(s: str) -> bool`: is `s` a palindrome, ignoring case and non-alphanumerics?"

# The unit tests: (input, expected). The grader never shows them to the candidate.
TESTS = [
    ("", True),
    ("a", True),
    ("Racecar", True),
    ("A man, a plan, a canal: Panama", True),
    ("hello", False),
    ("ab", False),
    ("No 'x' in Nixon", True),
    ("0P", False),
]

# Candidate solutions, as an LLM might produce them.
CANDIDATES: Dict[str, str] = {
    "correct": """
        def solve(s):
            t = [c.lower() for c in s if c.isalnum()]
            return t == t[::-1]
    """,
    "forgets_case": """
        def solve(s):
            t = [c for c in s if c.isalnum()]
            return t == t[::-1]
    """,
    "forgets_punctuation": """
        def solve(s):
            t = s.lower()
            return t == t[::-1]
    """,
    "infinite_loop": """
        def solve(s):
            while True:
                pass
    """,
    "syntax_error": """
        def solve(s)
            return True
    """,
    "always_true": """
        def solve(s):
            return True
    """,
    "tries_to_cheat": """
        # Tamper with the grader: replace the tests with one it passes. The
        # grader loaded the tests before importing the solution, so this fails.
        import json
        open("tests.json", "w").write(json.dumps([["", True]]))
        def solve(s):
            return True
    """,
}

# The grader runs inside the sandbox: it imports the candidate, runs every
# test in isolation and prints one JSON line with the results.
GRADER = textwrap.dedent(
    """
    import json, sys
    tests = json.load(open("tests.json"))  # before the candidate's code runs
    try:
        import solution
    except BaseException as e:
        print(json.dumps({"error": "import failed: %s: %s" % (type(e).__name__, e), "passed": 0}))
        sys.exit(0)
    passed = 0
    for arg, want in tests:
        try:
            passed += solution.solve(arg) == want
        except BaseException:
            pass
    print(json.dumps({"passed": passed}))
    """
)

TIMEOUT_S = 5


@dataclass
class Reward:
    name: str
    score: float
    passed: int
    total: int
    note: str = ""


def evaluate(name: str, code: str, client: Optional[sbx.Client] = None) -> Reward:
    """Run one candidate in a fresh sandbox and score it."""
    total = len(TESTS)
    with sbx.Sandbox.create(
        labels={"example": "reward_loop", "candidate": name.replace("_", "-")},
        memory="128M",
        pids=64,
        timeout=120,
        network="none",
        workdir="/root/grader",
        client=client,
    ) as sb:
        sb.files.write("/root/grader/solution.py", textwrap.dedent(code))
        sb.files.write("/root/grader/tests.json", json.dumps(TESTS))
        sb.files.write("/root/grader/grader.py", GRADER)
        r = sb.run(["python3", "grader.py"], timeout=TIMEOUT_S)
        if r.timed_out:
            return Reward(name, 0.0, 0, total, f"timed out after {TIMEOUT_S}s")
        if r.exit_code != 0:
            return Reward(name, 0.0, 0, total, f"grader exited {r.exit_code}: {r.stderr.strip()[-80:]}")
        try:
            out = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return Reward(name, 0.0, 0, total, "no result from the grader")
        if "error" in out:
            return Reward(name, 0.0, 0, total, out["error"].splitlines()[0][:80])
        passed = int(out["passed"])
        return Reward(name, passed / total, passed, total)


def main() -> int:
    client = sbx.Client()
    print(f"task: {TASK}")
    print(f"{len(CANDIDATES)} candidates, {len(TESTS)} tests each, {TIMEOUT_S}s timeout\n")
    # Candidates are independent: grade a few at a time, one sandbox each.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(evaluate, name, code, client) for name, code in CANDIDATES.items()}
        rewards: List[Reward] = [f.result() for f in futures.values()]
    print(f"{'candidate':<22} {'score':>5}  {'passed':>6}  note")
    for r in rewards:
        print(f"{r.name:<22} {r.score:5.2f}  {r.passed:>3}/{r.total:<2}  {r.note}".rstrip())
    best = max(rewards, key=lambda r: r.score)
    print(f"\nbest: {best.name} (score {best.score:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
