#!/usr/bin/env python3
"""Measures the Python SDK's file data path: upload and download of one file
of random bytes into and out of an existing sandbox, several samples each.

Called by ``sbx-bench -only files`` (cmd/sbx-bench/files.go) with the daemon's
address and a sandbox id, so that its figures sit beside the Go SDK's and the
loopback floor of the same run; runnable by hand too:

    PYTHONPATH=sdk/python /usr/bin/python3 scripts/bench-python-files.py \\
        --addr 127.0.0.1:7777 --sandbox ID --src /tmp/100m.bin --samples 3

Prints one JSON object: MiB/s of every sample of each step, and the CPU
seconds (user + system) this process spent in each sample ("cpu_<step>"):
what the client costs, as against the wall time spent waiting on the daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "sdk", "python"))

import sbx  # noqa: E402


class _Discard:
    """A binary writer that counts and drops (the Go bench's countWriter)."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, b: object) -> int:
        n = len(b)  # type: ignore[arg-type]
        self.n += n
        return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--sandbox", required=True)
    ap.add_argument("--src", required=True, help="local file to upload")
    ap.add_argument("--box-path", default="/tmp/bench-py.bin")
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--profile", default="", help="cProfile one sample of each step into this prefix")
    args = ap.parse_args()

    with open(args.src, "rb") as f:
        data = f.read()
    size = len(data)
    mib = size / (1 << 20)
    sb = sbx.Sandbox.from_id(args.sandbox, client=sbx.Client(args.addr, timeout=600))
    files = sb.files

    def upload() -> None:
        n = files.write(args.box_path, data)
        if n != size:
            raise SystemExit(f"uploaded {n} bytes, want {size}")

    def download() -> None:
        n = files.download_file(args.box_path, _Discard())
        if n != size:
            raise SystemExit(f"downloaded {n} bytes, want {size}")

    def read() -> None:
        got = files.read(args.box_path)
        if got != data:
            raise SystemExit("read() returned other bytes than were uploaded")

    steps = {"upload": upload, "download": download, "read": read}
    out = {k: [] for k in steps}
    out.update({"cpu_" + k: [] for k in steps})

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    for _ in range(args.samples):
        for name, f in steps.items():
            c0, t0 = cpu(), time.perf_counter()
            f()
            out[name].append(mib / (time.perf_counter() - t0))
            out["cpu_" + name].append(cpu() - c0)
    if args.profile:
        import cProfile

        for name, f in steps.items():
            cProfile.runctx("f()", globals(), {"f": f}, f"{args.profile}{name}.prof")
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
