"""Commands: streaming output, stdin, timeouts, exit codes, options."""

from __future__ import annotations

import threading
import time

import pytest

import sbx


def test_lines_arrive_while_the_command_runs(shared_sandbox: sbx.Sandbox) -> None:
    start = time.monotonic()
    p = shared_sandbox.exec("sh", "-c", "echo first; sleep 1; echo second")
    it = iter(p.stdout)
    assert next(it) == "first\n"
    first_at = time.monotonic() - start
    assert p.returncode is None  # still running
    assert next(it) == "second\n"
    second_at = time.monotonic() - start
    assert list(it) == []
    assert p.wait() == 0
    assert p.returncode == 0
    assert second_at - first_at >= 0.8, (first_at, second_at)
    assert first_at < 0.8, first_at


def test_stdout_and_stderr_are_independent(shared_sandbox: sbx.Sandbox) -> None:
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done"
    p = shared_sandbox.exec("sh", "-c", script)
    errs: list = []
    t = threading.Thread(target=lambda: errs.extend(p.stderr))
    t.start()
    outs = list(p.stdout)
    t.join(10)
    assert outs == ["out1\n", "out2\n", "out3\n"]
    assert errs == ["err1\n", "err2\n", "err3\n"]
    assert p.wait() == 0


def test_partial_lines_and_binary(shared_sandbox: sbx.Sandbox) -> None:
    p = shared_sandbox.exec("printf", "a\\nb")
    assert list(p.stdout) == ["a\n", "b"]
    p = shared_sandbox.exec("sh", "-c", "printf '\\377\\000x'")
    assert p.stdout.read_bytes() == b"\xff\x00x"
    p.wait()


def test_run_collects_output(shared_sandbox: sbx.Sandbox) -> None:
    r = shared_sandbox.run("echo out; echo err >&2; exit 3")
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"
    assert r.exit_code == 3
    assert not r.timed_out and not r.ok
    r = shared_sandbox.run(["python3", "-c", "print(6*7)"])
    assert (r.stdout, r.exit_code, r.ok) == ("42\n", 0, True)


def test_raise_on_error(shared_sandbox: sbx.Sandbox) -> None:
    with pytest.raises(sbx.CommandError) as ei:
        shared_sandbox.run("echo boom >&2; exit 7", raise_on_error=True)
    assert ei.value.exit_code == 7
    assert ei.value.result.stderr == "boom\n"
    assert "boom" in str(ei.value)
    assert shared_sandbox.run("true", raise_on_error=True).exit_code == 0


def test_stdin(shared_sandbox: sbx.Sandbox) -> None:
    r = shared_sandbox.run(["python3", "-c", "import sys; d = sys.stdin.read(); print(len(d), d.upper())"],
                           stdin=b"hello stdin")
    assert r.stdout == "11 HELLO STDIN\n"
    p = shared_sandbox.exec("wc", "-l", stdin="a\nb\nc\n")
    assert p.stdout.read().strip() == "3"
    # Without stdin the command sees EOF at once.
    assert shared_sandbox.run("cat", timeout=10).stdout == ""


def test_timeout(shared_sandbox: sbx.Sandbox) -> None:
    start = time.monotonic()
    r = shared_sandbox.run("echo before; sleep 30; echo after", timeout=1)
    took = time.monotonic() - start
    assert r.timed_out
    assert r.exit_code == 137
    assert r.stdout == "before\n"
    assert took < 10
    with pytest.raises(sbx.CommandError) as ei:
        shared_sandbox.run("sleep 30", timeout=0.5, raise_on_error=True)
    assert "timed out" in str(ei.value)


def test_exit_codes_and_signals(shared_sandbox: sbx.Sandbox) -> None:
    for code in (0, 1, 42, 255):
        assert shared_sandbox.exec("sh", "-c", f"exit {code}").wait() == code
    p = shared_sandbox.exec("sh", "-c", "kill -TERM $$")
    assert p.wait() == 128 + 15
    assert p.exit_status is not None and p.exit_status.signal == 15


def test_command_not_found(shared_sandbox: sbx.Sandbox) -> None:
    r = shared_sandbox.run(["no-such-command-xyz"])
    assert r.exit_code == 127
    assert r.error
    with pytest.raises(sbx.CommandError):
        shared_sandbox.run(["no-such-command-xyz"], raise_on_error=True)


def test_env_workdir_user(shared_sandbox: sbx.Sandbox) -> None:
    r = shared_sandbox.run("echo $A-$B; pwd; id -u", env={"A": "1", "B": "two"}, workdir="/tmp", user="1000:1000")
    assert r.stdout.split() == ["1-two", "/tmp", "1000"]
    r = shared_sandbox.exec("sh", "-c", "echo $X", env={"X": "from-exec"})
    assert r.stdout.read() == "from-exec\n"


def test_shell_flag_and_list_argv(shared_sandbox: sbx.Sandbox) -> None:
    assert shared_sandbox.exec("echo a b | wc -w", shell=True).stdout.read().strip() == "2"
    assert shared_sandbox.exec(["echo", "x y"]).stdout.read() == "x y\n"
    with pytest.raises(ValueError):
        shared_sandbox.exec()


def test_wait_timeout_and_kill(shared_sandbox: sbx.Sandbox) -> None:
    p = shared_sandbox.exec("sh", "-c", "echo $$ > /tmp/killme.pid; exec sleep 60")
    with pytest.raises(TimeoutError):
        p.wait(timeout=0.3)
    p.kill()
    with pytest.raises(sbx.CanceledError):
        p.wait(timeout=10)
    # The daemon killed the command when the client went away.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = shared_sandbox.run("kill -0 $(cat /tmp/killme.pid) 2>/dev/null && echo alive || echo gone")
        if r.stdout.strip() == "gone":
            break
        time.sleep(0.2)
    assert r.stdout.strip() == "gone"


def test_exec_in_missing_sandbox(client: sbx.Client, make_sandbox) -> None:
    sb = make_sandbox()
    sb.terminate()
    with pytest.raises(sbx.NotFoundError):
        sb.exec("true")
    with pytest.raises(sbx.NotFoundError):
        sb.run("true")
    # Client streams get the error even when the daemon answers before
    # reading the whole upload.
    with pytest.raises(sbx.NotFoundError):
        sb.files.write("/root/x", b"small")
    with pytest.raises(sbx.NotFoundError):
        sb.files.write("/root/x", bytes(8 << 20))
    with pytest.raises(sbx.NotFoundError):
        sb.files.read("/root/x")
    with pytest.raises(sbx.NotFoundError):
        sb.refresh()


def test_large_output(shared_sandbox: sbx.Sandbox) -> None:
    r = shared_sandbox.run(["python3", "-c", "import sys; sys.stdout.write('x' * (3 << 20))"])
    assert len(r.stdout) == 3 << 20
    p = shared_sandbox.exec("seq", "1", "20000")
    n = sum(1 for _ in p.stdout)
    assert n == 20000 and p.wait() == 0


def test_concurrent_execs(shared_sandbox: sbx.Sandbox) -> None:
    procs = [shared_sandbox.exec("sh", "-c", f"sleep 0.5; echo {i}") for i in range(4)]
    assert [p.stdout.read() for p in procs] == [f"{i}\n" for i in range(4)]
    assert all(p.wait() == 0 for p in procs)
