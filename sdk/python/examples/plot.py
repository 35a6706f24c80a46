#!/usr/bin/env python3
"""sbx code execution: plot with matplotlib in a sandbox, save the captured PNGs.

The code does nothing special to export its figure: open matplotlib figures
(and files written under $SBX_OUTPUT_DIR) come back as artifacts. Needs
matplotlib in the sandbox's image (the built-in "host" image has it when the
host has python3-matplotlib). Run a daemon first, then::

    SBX_ADDR=127.0.0.1:7777 PYTHONPATH=sdk/python python3 sdk/python/examples/plot.py [OUTDIR]
"""

import sys
import tempfile

import sbx

CODE = """
import math, os
import matplotlib.pyplot as plt

xs = [i / 10 for i in range(100)]
plt.plot(xs, [math.sin(x) for x in xs], label="sin")
plt.legend()
plt.title("made in a sandbox")
with open(os.path.join(os.environ["SBX_OUTPUT_DIR"], "points.csv"), "w") as f:
    f.writelines(f"{x},{math.sin(x)}\\n" for x in xs)
print("plotted", len(xs), "points")
"""


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sbx-plot-")
    with sbx.Sandbox.create(labels={"example": "plot"}, memory="512M", timeout=300) as sb:
        res = sb.run_code(CODE, timeout=120, on_stdout=lambda s: print(s, end=""))
        if not res.ok:
            print("failed:", res.error, res.stderr, file=sys.stderr)
            return 1
        for art in res.artifacts:
            print(f"saved {art.save(out_dir)} ({art.mime}, {art.size} bytes)")

        # A context keeps state between runs, like a notebook kernel.
        with sb.create_context("python") as ctx:
            ctx.run("import statistics\ndata = [3, 1, 4, 1, 5, 9, 2, 6]")
            print("median:", ctx.run("statistics.median(data)").text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
