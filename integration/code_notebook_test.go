package integration

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func artifactNames(arts []*sbxv1.Artifact) string {
	names := make([]string, len(arts))
	for i, a := range arts {
		names[i] = a.GetName()
	}
	return strings.Join(names, ",")
}

// TestRunCodeNotebook: the habits of LLM-written notebook code work in a
// real box: each plt.show() ends its figure (three shows, three PNGs;
// seaborn then matplotlib stay apart), display() of a DataFrame, !cmd and
// %pip install of a local wheel in a context; results carry the images as
// Plots (base64 + format).
func TestRunCodeNotebook(t *testing.T) {
	if !hostHas("/usr/bin/python3", "-c", "import seaborn, pandas") {
		t.Skip("host python3 lacks seaborn or pandas (scripts/install-deps.sh installs python3-seaborn)")
	}
	_, sb, ctx := codeSandbox(t)
	opts := sbx.RunCodeOptions{Timeout: 2 * time.Minute}

	t.Run("three-shows", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.plot([1, i])\n    plt.show()\n", opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := artifactNames(res.Artifacts); got != "figure-1.png,figure-2.png,figure-3.png" || res.ExitCode != 0 {
			t.Errorf("got artifacts %s exit %d (stderr %q), want three figures", got, res.ExitCode, res.Stderr)
		}
		if len(res.Plots) != 3 || res.Plots[0].Format != "png" || !strings.HasPrefix(res.Plots[0].ContentBase64, "iVBORw0KGgo") {
			t.Errorf("got %d plots (first %+.40v), want 3 base64 PNGs", len(res.Plots), res.Plots)
		}
	})
	t.Run("seaborn-then-matplotlib", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "import seaborn as sns, matplotlib.pyplot as plt\nsns.histplot([1, 2, 2, 3])\nplt.show()\nplt.plot([3, 2, 1])\nprint(len(plt.gca().patches))\n", opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := artifactNames(res.Artifacts); got != "figure-1.png,figure-2.png" || string(res.Stdout) != "0\n" {
			t.Errorf("got artifacts %s stdout %q (stderr %q), want two figures and no seaborn bars on the second", got, res.Stdout, res.Stderr)
		}
	})
	t.Run("context", func(t *testing.T) {
		if !hostHas("/usr/bin/python3", "-m", "pip", "--version") {
			t.Skip("host python3 has no pip")
		}
		if err := sb.WriteFile(ctx, "/tmp/nbwheels/sbxnb-1.0-py3-none-any.whl", wheel(t, "sbxnb", "def answer():\n    return 7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cc, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close(ctx) //nolint:errcheck
		steps := []struct {
			name, code, stdout, value, artifacts string
		}{
			{name: "display dataframe", code: "import pandas as pd\ndisplay(pd.DataFrame({'a': [1, 2]}))", stdout: "   a\n0  1\n1  2\n", artifacts: "display-1.html"},
			{name: "shell line", code: "!echo hi\nn = !echo a; echo b\nlen(n)", stdout: "hi\n", value: "2"},
			{name: "pip magic", code: "%pip install -q --no-index --find-links /tmp/nbwheels sbxnb\nimport sbxnb\nsbxnb.answer()", value: "7"},
			{name: "show in a context", code: "import matplotlib.pyplot as plt\nplt.plot([1])\nplt.show()\nplt.plot([2])\nplt.show()", artifacts: "figure-1.png,figure-2.png"},
		}
		for _, s := range steps {
			res, err := cc.Run(ctx, s.code, opts)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if string(res.Stdout) != s.stdout || res.Value.GetText() != s.value || artifactNames(res.Artifacts) != s.artifacts || res.Error != "" {
				t.Errorf("%s: got stdout %q value %q artifacts %s error %q (stderr %q), want %q %q %s", s.name, res.Stdout,
					res.Value.GetText(), artifactNames(res.Artifacts), res.Error, res.Stderr, s.stdout, s.value, s.artifacts)
			}
		}
		res, err := cc.Run(ctx, "display(pd.DataFrame({'a': [1]}))", opts)
		if err != nil || len(res.Artifacts) != 1 || !strings.HasPrefix(string(res.Artifacts[0].GetContent()), "<div>") {
			t.Errorf("display html: got %v, %v, want one HTML table", err, res)
		}
	})
}

// TestRunCodePolicyRules: a custom rule's critical severity is honoured, an
// unknown severity number is refused, no-filesystem catches open(..., 'w')
// and a shell line in python; cpp libraries are refused saying why.
func TestRunCodePolicyRules(t *testing.T) {
	_, sb, ctx := codeSandbox(t)
	enforce := func(th sbxv1.Severity, presets []string, rules ...*sbxv1.PolicyRule) sbx.RunCodeOptions {
		return sbx.RunCodeOptions{Policy: &sbxv1.CodePolicy{Mode: sbxv1.PolicyMode_POLICY_MODE_ENFORCE, Threshold: th, Presets: presets, Rules: rules}}
	}
	tests := []struct {
		name, lang, code string
		opts             sbx.RunCodeOptions
		code_            connect.Code // 0: runs
		msg              string
	}{
		{"critical rule blocks at critical", "python", "print('ok')", enforce(sbxv1.Severity_SEVERITY_CRITICAL, nil,
			&sbxv1.PolicyRule{Id: "no-print", Pattern: `\bprint\(`, Severity: sbxv1.Severity_SEVERITY_CRITICAL}), connect.CodePermissionDenied, "no-print [critical"},
		{"high rule passes at critical", "python", "print('ok')", enforce(sbxv1.Severity_SEVERITY_CRITICAL, nil,
			&sbxv1.PolicyRule{Id: "no-print", Pattern: `\bprint\(`, Severity: sbxv1.Severity_SEVERITY_HIGH}), 0, ""},
		{"unknown severity", "python", "print('ok')", enforce(0, nil, &sbxv1.PolicyRule{Id: "x", Pattern: "p", Severity: 9}), connect.CodeInvalidArgument, "unknown severity 9"},
		{"no-filesystem open w", "python", "with open('/tmp/x', 'w') as f:\n    f.write('x')\n", enforce(sbxv1.Severity_SEVERITY_MEDIUM, []string{"no-filesystem"}), connect.CodePermissionDenied, "py-open-write"},
		{"no-subprocess shell line", "python", "!id\n", enforce(0, []string{"no-subprocess"}), connect.CodePermissionDenied, "py-shell-escape"},
		{"cpp libraries", "cpp", "int main() {}", sbx.RunCodeOptions{Libraries: []string{"boost"}}, connect.CodeInvalidArgument, "C++ has no package manager"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := sb.RunCode(ctx, tt.lang, tt.code, tt.opts)
			if tt.code_ == 0 {
				if err != nil || res.ExitCode != 0 {
					t.Errorf("got %v, %+v, want a run", err, res)
				}
				return
			}
			if connect.CodeOf(err) != tt.code_ || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v, want %v naming %q", err, tt.code_, tt.msg)
			}
		})
	}
}
