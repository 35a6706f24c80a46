"""run_code: one-shot runs, artifacts, contexts and code policy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import sbx

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _host_has_matplotlib() -> bool:
    return subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"], capture_output=True).returncode == 0


def _host_has(module: str) -> bool:
    return subprocess.run(["/usr/bin/python3", "-c", "import " + module], capture_output=True).returncode == 0


def test_run_code_python(shared_sandbox: sbx.Sandbox) -> None:
    seen: list = []
    res = shared_sandbox.run_code("python", "import sys\nprint('hi')\nprint('err', file=sys.stderr)\nsys.exit(2)",
                                  on_stdout=seen.append)
    assert res.stdout == "hi\n"
    assert res.stderr == "err\n"
    assert res.exit_code == 2
    assert not res.ok
    assert "".join(seen) == "hi\n"


def test_run_code_artifact_file(shared_sandbox: sbx.Sandbox, tmp_path: str) -> None:
    res = shared_sandbox.run_code("bash", 'echo "a,b" > "$SBX_OUTPUT_DIR/t.csv"')
    assert res.ok, res
    assert [(a.name, a.format, a.mime, a.content) for a in res.artifacts] == [("t.csv", "csv", "text/csv", b"a,b\n")]
    path = res.artifacts[0].save(str(tmp_path))
    with open(path, "rb") as f:
        assert f.read() == b"a,b\n"


def test_run_code_context(shared_sandbox: sbx.Sandbox) -> None:
    with shared_sandbox.create_context("python") as ctx:
        assert ctx.run("import os\nx = 6\nos.chdir('/tmp')").ok
        res = ctx.run("x * 7")
        assert res.text == "42"
        assert ctx.run("os.getcwd()").text == "'/tmp'"
        bad = ctx.run("y")
        assert bad.error == "NameError: name 'y' is not defined"
        assert [c.id for c in shared_sandbox.list_contexts()] == [ctx.id]
    assert shared_sandbox.list_contexts() == []


def test_run_code_policy(shared_sandbox: sbx.Sandbox) -> None:
    code = "# import subprocess\nimport subprocess\nprint('ran')"
    res = shared_sandbox.run_code("python", code, policy=["default"])
    assert res.stdout == "ran\n"
    assert [(f.rule, f.severity, f.line) for f in res.findings] == [("py-subprocess", "high", 2)]
    with pytest.raises(sbx.PermissionDeniedError, match="py-subprocess"):
        shared_sandbox.run_code("python", code, policy=["default"], enforce=True)


@pytest.mark.skipif(not _host_has("plotly"), reason="host python3 has no plotly")
def test_run_code_plotly(shared_sandbox: sbx.Sandbox, tmp_path: str) -> None:
    code = "import plotly.express as px\npx.bar(x=['a', 'b'], y=[1, 2]).show()"
    res = shared_sandbox.run_code("python", code)
    assert res.ok, res
    got = {a.name: a for a in res.artifacts}
    assert sorted(got) == ["plotly-1.html", "plotly-1.plotly.json"]
    html, fig = got["plotly-1.html"], got["plotly-1.plotly.json"]
    assert (html.format, html.mime) == ("html", "text/html")
    assert b"Plotly.newPlot" in html.content and b'<script src="http' not in html.content
    assert fig.mime == "application/vnd.plotly.v1+json"
    assert json.loads(fig.content)["data"][0]["type"] == "bar"
    with open(html.save(str(tmp_path)), "rb") as f:
        assert f.read() == html.content
    with shared_sandbox.create_context("python") as ctx:
        res = ctx.run(code.replace(".show()", ""))
        assert res.text == "<Figure>"
        assert sorted(a.name for a in res.artifacts) == ["plotly-1.html", "plotly-1.plotly.json"]


@pytest.mark.skipif(not _host_has("seaborn"), reason="host python3 has no seaborn")
def test_run_code_seaborn(shared_sandbox: sbx.Sandbox) -> None:
    res = shared_sandbox.run_code("python", "import seaborn as sns\nsns.histplot([1, 2, 2, 3])")
    assert res.ok, res
    assert [(a.name, a.mime) for a in res.artifacts] == [("figure-1.png", "image/png")]
    assert res.artifacts[0].content.startswith(b"\x89PNG")


@pytest.mark.skipif(shutil.which("ruby") is not None, reason="the host has ruby")
def test_run_code_missing_language(shared_sandbox: sbx.Sandbox) -> None:
    with pytest.raises(sbx.FailedPreconditionError, match="not available in this image"):
        shared_sandbox.run_code("ruby", "puts 1")


@pytest.mark.skipif(not _host_has_matplotlib(), reason="host python3 has no matplotlib")
def test_plot_example(daemon_addr: str, tmp_path: str) -> None:
    env = dict(os.environ, SBX_ADDR=daemon_addr, PYTHONPATH=os.path.dirname(EXAMPLES))
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "plot.py"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert os.path.getsize(os.path.join(str(tmp_path), "figure-1.png")) > 1000
    assert "plotted 100 points" in out
    assert "figure-1.png (image/png" in out
    assert "points.csv (text/csv" in out
    assert "median: 3.5" in out


def test_run_code_argument_orders() -> None:
    from sbx.code import code_and_language

    assert code_and_language("print(1)", None) == ("print(1)", "python")
    assert code_and_language("echo hi", "bash") == ("echo hi", "bash")
    assert code_and_language("python", "print(1)") == ("print(1)", "python")  # the older (language, code) order
    assert code_and_language("R", "print(1)") == ("print(1)", "R")
    with pytest.raises(TypeError):
        code_and_language(None, "python")


def test_policy_rule_severities() -> None:
    from sbx.code import policy_request

    req = policy_request(None, True, "Critical", [
        {"id": "a", "pattern": "x", "severity": "critical"},
        {"id": "b", "pattern": "x", "severity": "SEVERITY_HIGH"},
        {"id": "c", "pattern": "x", "severity": 1},
        {"id": "d", "pattern": "x"},
    ])
    assert req is not None
    assert [r.get("severity") for r in req["rules"]] == ["SEVERITY_CRITICAL", "SEVERITY_HIGH", "SEVERITY_LOW", None]
    assert req["threshold"] == "SEVERITY_CRITICAL"
    with pytest.raises(ValueError, match="policy rule 'e': unknown severity 'severe'"):
        policy_request(None, False, None, [{"id": "e", "pattern": "x", "severity": "severe"}])


def test_plots_of_artifacts() -> None:
    from sbx.code import Artifact, plots_of

    arts = [Artifact("figure-1.png", "png", "image/png", 3, b"png"), Artifact("t.csv", "csv", "text/csv", 1, b"a"),
            Artifact("display-1.svg", "svg", "image/svg+xml", 4, b"<sv>")]
    assert [(p.name, p.format, p.content_base64) for p in plots_of(arts)] == [
        ("figure-1.png", "png", "cG5n"), ("display-1.svg", "svg", "PHN2Pg==")]
    p = plots_of(arts)[0]
    assert p.content == b"png"
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = p.save(d)
        assert out.endswith("figure-1.png") and open(out, "rb").read() == b"png"


def test_run_code_notebook_habits(shared_sandbox: sbx.Sandbox) -> None:
    if not _host_has_matplotlib():
        pytest.skip("host python3 has no matplotlib")
    res = shared_sandbox.run_code(
        "import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.plot([1, i])\n    plt.show()\n!echo hi\ndisplay(1)")
    assert res.ok, res
    assert res.stdout == "hi\n1\n"
    assert [(p.name, p.format) for p in res.plots] == [("figure-1.png", "png"), ("figure-2.png", "png"), ("figure-3.png", "png")]
    assert all(p.content_base64.startswith("iVBOR") for p in res.plots)
