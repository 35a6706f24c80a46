package codeexec

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const hostPython = "/usr/bin/python3"

// runRunner runs the one-shot boot and runner with the host's python, as
// the daemon does in a sandbox, with lib as the runner's module path.
func runRunner(t *testing.T, lib, out, code string) (stdout, stderr string, exit int) {
	t.Helper()
	if _, err := os.Stat(hostPython); err != nil {
		t.Skip("no " + hostPython)
	}
	dir := t.TempDir()
	cmd := exec.Command(hostPython, "-c", pythonBoot, lib, pythonRunner, filepath.Join(dir, "main.py"), code)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "MPLBACKEND=Agg", "SBX_OUTPUT_DIR=" + out, "SBX_RUN_TOKEN=\x1etok:"}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		exit = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), exit
}

func hostHasModule(mod string) bool {
	return exec.Command(hostPython, "-c", "import "+mod).Run() == nil
}

func TestRunner(t *testing.T) {
	base := t.TempDir()
	lib := filepath.Join(base, "lib", "sbx_runner_test")
	out := filepath.Join(base, "out")
	const empty = "\x1etok:empty\n"
	tests := []struct {
		name, code           string
		stdout, stderr       string // stderr: a substring
		exit                 int
		marked               bool // the "no artifacts" mark on stderr
		artifacts            []string
		needs                string // a module the host python must have
		noModule             string // a module the host python must lack
		worldWritableLibFile bool
	}{
		{name: "print", code: "print(1)", stdout: "1\n", marked: true},
		{name: "second run uses the cached runner", code: "import sys\nprint(__name__, sys.argv[0].endswith('main.py'), 'sbx_runner_test' in sys.modules)", stdout: "__main__ True True\n", marked: true},
		{name: "env token hidden", code: "import os\nprint(os.environ.get('SBX_RUN_TOKEN'))", stdout: "None\n", marked: true},
		{name: "exit code", code: "import sys\nsys.exit(3)", exit: 3, marked: true},
		{name: "exception", code: "x = 1\n1/0", stderr: "main.py\", line 2, in <module>\n    1/0\n", exit: 1, marked: true},
		{name: "syntax error", code: "print(1", stderr: "main.py\", line 1\n    print(1\n", exit: 1, marked: true},
		{name: "output file", code: "import os\nopen(os.environ['SBX_OUTPUT_DIR'] + '/a.txt', 'w').write('a')", artifacts: []string{"a.txt"}},
		{name: "untrusted lib falls back to compiling", code: "import sys\nprint('sbx_runner_test' in sys.modules)", stdout: "False\n", marked: true, worldWritableLibFile: true},
		{name: "plotly", code: "import plotly.express as px\npx.bar(x=[1], y=[2]).show()", artifacts: []string{"plotly-1.html", "plotly-1.plotly.json"}, needs: "plotly"},
		{name: "plotly not shown", code: "import plotly.express as px\npx.bar(x=[1], y=[2])", marked: true, needs: "plotly"},
		{name: "matplotlib", code: "import matplotlib.pyplot as plt\nplt.plot([1, 2])", artifacts: []string{"figure-1.png"}, needs: "matplotlib"},
		{name: "each plt.show ends its figures", code: "import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.plot([1, i])\n    plt.show()\nprint(plt.get_fignums())",
			stdout: "[]\n", artifacts: []string{"figure-1.png", "figure-2.png", "figure-3.png"}, needs: "matplotlib"},
		{name: "seaborn then matplotlib are separate figures", code: "import seaborn as sns, matplotlib.pyplot as plt\nsns.histplot([1, 2, 2, 3])\nplt.show()\nplt.plot([3, 2, 1])\nprint(len(plt.gca().patches))",
			stdout: "0\n", artifacts: []string{"figure-1.png", "figure-2.png"}, needs: "seaborn"},
		{name: "figure.show", code: "import matplotlib.pyplot as plt\nfig = plt.figure()\nfig.show()\nplt.figure()", artifacts: []string{"figure-1.png", "figure-2.png"}, needs: "matplotlib"},
		{name: "display dataframe", code: "import pandas as pd\ndisplay(pd.DataFrame({'a': [1]}))", stdout: "   a\n0  1\n", artifacts: []string{"display-1.html"}, needs: "pandas"},
		{name: "display plain value", code: "display(1, 'x')", stdout: "1\n'x'\n", marked: true},
		{name: "IPython.display stand-in", code: "from IPython.display import display, HTML, Markdown\ndisplay(HTML('<b>x</b>'), Markdown('# t'))", stdout: "<b>x</b>\n# t\n",
			artifacts: []string{"display-1.html", "display-1.md"}, noModule: "IPython"},
		{name: "libraries still see no IPython", code: "import types\nlib = types.ModuleType('lib')\nexec('try:\\n    import IPython\\n    r = 1\\nexcept ImportError:\\n    r = 0', lib.__dict__)\nimport IPython\nprint(lib.r, IPython.get_ipython())",
			stdout: "0 None\n", marked: true, noModule: "IPython"},
		{name: "shell lines", code: "import sys\n!echo hi {1+1}\nx = !echo a; echo b\nprint(x, _exit_code)\n!exit 3\nprint(_exit_code)", stdout: "hi 2\n['a', 'b'] 0\n3\n", marked: true},
		{name: "bash cell", code: "%%bash\necho $((1+2))", stdout: "3\n", marked: true},
		{name: "line magics", code: "%matplotlib inline\n%cd /\n%env SBX_T=1\nimport os\nprint(os.environ['SBX_T'])", stdout: "/\n1\n", marked: true},
		{name: "unknown magic", code: "%timeit 1", stderr: "NotImplementedError: unsupported magic %timeit", exit: 1, marked: true},
		{name: "bang inside a string is left alone", code: "s = \"\"\"\n!echo no\n\"\"\"\nprint(s.strip())", stdout: "!echo no\n", marked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needs != "" && !hostHasModule(tt.needs) {
				t.Skipf("host python3 has no %s", tt.needs)
			}
			if tt.noModule != "" && hostHasModule(tt.noModule) {
				t.Skipf("host python3 has %s", tt.noModule)
			}
			if tt.worldWritableLibFile {
				if err := os.Chmod(lib+".py", 0o666); err != nil {
					t.Fatal(err)
				}
				defer os.Chmod(lib+".py", 0o644) //nolint:errcheck
			}
			os.RemoveAll(out)
			stdout, stderr, exit := runRunner(t, lib, out, tt.code)
			if stdout != tt.stdout || exit != tt.exit || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("got stdout %q exit %d stderr %q, want %q %d %q", stdout, exit, stderr, tt.stdout, tt.exit, tt.stderr)
			}
			if got := strings.Contains(stderr, empty); got != tt.marked {
				t.Errorf("got empty mark %v (stderr %q), want %v", got, stderr, tt.marked)
			}
			var names []string
			ents, err := os.ReadDir(out)
			if tt.marked && !os.IsNotExist(err) {
				t.Errorf("marked empty, but %s: %v", out, err)
			}
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if strings.Join(names, ",") != strings.Join(tt.artifacts, ",") {
				t.Errorf("got outputs %v, want %v", names, tt.artifacts)
			}
		})
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(lib), "__pycache__", "sbx_runner_test.*.pyc")); len(m) != 1 {
		t.Errorf("got cached bytecode %v, want one .pyc", m)
	}
}

func TestFormatOf(t *testing.T) {
	tests := []struct{ name, format, mime string }{
		{"figure-1.png", "png", "image/png"},
		{"plotly-1.html", "html", "text/html"},
		{"plotly-1.plotly.json", "json", "application/vnd.plotly.v1+json"},
		{"data.json", "json", "application/json"},
		{"x.unknownext", "unknownext", "application/octet-stream"},
	}
	for _, tt := range tests {
		if f, m := formatOf(tt.name); f != tt.format || m != tt.mime {
			t.Errorf("formatOf(%q) = %q, %q, want %q, %q", tt.name, f, m, tt.format, tt.mime)
		}
	}
}
