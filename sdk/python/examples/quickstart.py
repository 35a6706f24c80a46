#!/usr/bin/env python3
"""sbx quickstart: create a sandbox, run commands, stream output, move files.

Run a daemon first (``make run`` in the repository root), then::

    SBX_ADDR=127.0.0.1:7777 PYTHONPATH=sdk/python python3 sdk/python/examples/quickstart.py
"""

import os
import sys
import tempfile
import time

import sbx


def main() -> int:
    client = sbx.Client()  # $SBX_ADDR, else 127.0.0.1:7777
    print("daemon", client.addr, "version", client.version().get("version"))

    # The sandbox is destroyed when the block exits, even on errors.
    with sbx.Sandbox.create(
        labels={"example": "quickstart"},
        memory="256M",
        cpu=1,
        timeout=300,
        env={"GREETING": "hello"},
        client=client,
    ) as sb:
        print("created", sb.id, sb.state)

        # run(): a shell command line (or an argv list), output collected.
        r = sb.run("echo $GREETING from $(hostname); python3 -c 'print(6*7)'")
        print(r.stdout, end="")
        print("exit code", r.exit_code)

        # exec(): output streamed line by line while the command runs.
        p = sb.exec("sh", "-c", "for i in 1 2 3; do echo tick $i; sleep 0.3; done; echo done >&2")
        start = time.monotonic()
        for line in p.stdout:
            print(f"  [{time.monotonic() - start:4.1f}s] {line}", end="")
        print("  stderr:", p.stderr.read().strip(), "| exit", p.wait())

        # stdin is given up front.
        r = sb.run(["python3", "-c", "import sys; print(sys.stdin.read().upper())"], stdin="shout\n")
        print("stdin ->", r.stdout.strip())

        # Timeouts kill the command's whole process group.
        r = sb.run("sleep 30", timeout=1)
        print("timed out:", r.timed_out, "exit", r.exit_code)

        # Files.
        sb.files.write("/root/work/data.csv", "a,b\n1,2\n3,4\n")
        print("files:", [f.name for f in sb.files.list("/root/work")])
        r = sb.run("python3 -c \"import csv; print(sum(int(r['b']) for r in csv.DictReader(open('data.csv'))))\"",
                   workdir="/root/work")
        print("sum of b:", r.stdout.strip())

        # Directories, both ways, via tar.
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            os.makedirs(os.path.join(src, "pkg"))
            with open(os.path.join(src, "pkg", "mod.py"), "w") as f:
                f.write("VALUE = 41\n")
            sb.files.upload_dir(src, "/root/project")
            sb.run("cd /root/project && python3 -c 'import pkg.mod as m; print(m.VALUE + 1)' > out.txt",
                   raise_on_error=True)
            out = os.path.join(tmp, "out")
            sb.files.download_dir("/root/project", out)
            print("downloaded out.txt:", open(os.path.join(out, "out.txt")).read().strip())

        # Find sandboxes by label; live usage.
        print("by label:", [s.id for s in sbx.Sandbox.list(labels={"example": "quickstart"}, client=client)])
        st = sb.stats
        print(f"memory {st.memory_bytes >> 20} MiB, pids {st.pids}")

        # Freeze and resume.
        sb.stop()
        print("state", sb.state)
        sb.start()
        print("state", sb.state, "| still works:", sb.run("echo yes").stdout.strip())

        # Errors carry codes.
        try:
            sb.files.read("/no/such/file")
        except sbx.NotFoundError as e:
            print("error code:", e.code)
    print("destroyed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
