package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

const plotlyMime = "application/vnd.plotly.v1+json"

// plotlyArtifacts checks that arts are exactly one shown plotly figure:
// plotly-1.html (self-contained: plotly.js inlined, no script from a CDN)
// and plotly-1.plotly.json (the figure, with the given trace type).
func plotlyArtifacts(t *testing.T, arts []*sbxv1.Artifact, trace string, stderr []byte) {
	t.Helper()
	byName := map[string]*sbxv1.Artifact{}
	for _, a := range arts {
		byName[a.GetName()] = a
	}
	h, j := byName["plotly-1.html"], byName["plotly-1.plotly.json"]
	if len(arts) != 2 || h == nil || j == nil {
		names := make([]string, 0, len(arts))
		for _, a := range arts {
			names = append(names, a.GetName())
		}
		t.Fatalf("got artifacts %v (stderr %q), want plotly-1.html and plotly-1.plotly.json", names, stderr)
	}
	html := string(h.GetContent())
	if h.GetMime() != "text/html" || h.GetFormat() != "html" || h.GetSize() != int64(len(html)) ||
		!strings.Contains(html, "Plotly.newPlot") || !strings.Contains(html, "plotly.js v") || strings.Contains(html, `<script src="http`) {
		t.Errorf("got html artifact %s %s size %d (%d bytes), want a self-contained plotly page", h.GetMime(), h.GetFormat(), h.GetSize(), len(html))
	}
	var fig struct {
		Data []struct {
			Type string `json:"type"`
		} `json:"data"`
	}
	if j.GetMime() != plotlyMime || json.Unmarshal(j.GetContent(), &fig) != nil || len(fig.Data) != 1 || fig.Data[0].Type != trace {
		t.Errorf("got json artifact %s %.200q, want %s with one %s trace", j.GetMime(), j.GetContent(), plotlyMime, trace)
	}
}

// TestRunCodePlots: plotly figures shown (one-shot and in a context, where
// the last expression's value counts as shown) and seaborn plots become
// artifacts without the code doing anything special; the CLI saves them.
func TestRunCodePlots(t *testing.T) {
	if !hostHas("/usr/bin/python3", "-c", "import plotly, seaborn") {
		t.Skip("host python3 lacks plotly or seaborn (scripts/install-deps.sh installs python3-plotly and python3-seaborn)")
	}
	d, sb, ctx := codeSandbox(t)
	opts := sbx.RunCodeOptions{Timeout: time.Minute}

	t.Run("plotly-one-shot", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "import plotly.graph_objects as go\nfig = go.Figure(go.Bar(x=['a', 'b'], y=[1, 3]))\nfig.show()\nprint('shown')\n", opts)
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) != "shown\n" || res.ExitCode != 0 {
			t.Errorf("got stdout %q exit %d stderr %q, want shown/0", res.Stdout, res.ExitCode, res.Stderr)
		}
		plotlyArtifacts(t, res.Artifacts, "bar", res.Stderr)
	})
	t.Run("plotly-not-shown", func(t *testing.T) {
		res, err := sb.RunCode(ctx, "python", "import plotly.express as px\nfig = px.line(x=[1, 2], y=[2, 1])\n", opts)
		if err != nil || res.ExitCode != 0 || len(res.Artifacts) != 0 {
			t.Errorf("got %v, exit %d, artifacts %d (stderr %q), want none: only shown figures are captured", err, res.ExitCode, len(res.Artifacts), res.Stderr)
		}
	})
	t.Run("plotly-context", func(t *testing.T) {
		cc, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close(ctx) //nolint:errcheck
		res, err := cc.Run(ctx, "import plotly.express as px\nfig = px.scatter(x=[1, 2, 3], y=[3, 1, 2])\nfig", opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.Value == nil || res.Value.GetText() != "<Figure>" {
			t.Errorf("got value %v, want <Figure>", res.Value)
		}
		plotlyArtifacts(t, res.Artifacts, "scatter", res.Stderr)
		res, err = cc.Run(ctx, "import plotly.io as pio\npio.show(dict(data=[dict(type='pie', values=[1, 2])]))", opts)
		if err != nil {
			t.Fatal(err)
		}
		plotlyArtifacts(t, res.Artifacts, "pie", res.Stderr)
		if res, err = cc.Run(ctx, "fig.update_layout(title='t');None", opts); err != nil || len(res.Artifacts) != 0 {
			t.Errorf("figure neither shown nor last: got %v, %d artifacts", err, len(res.Artifacts))
		}
	})
	t.Run("seaborn", func(t *testing.T) {
		code := "import seaborn as sns\nsns.barplot(x=['a', 'b', 'c'], y=[1, 3, 2])\n"
		res, err := sb.RunCode(ctx, "python", code, opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || len(res.Artifacts) != 1 || res.Artifacts[0].GetName() != "figure-1.png" ||
			!bytes.HasPrefix(res.Artifacts[0].GetContent(), []byte("\x89PNG")) {
			t.Errorf("got exit %d artifacts %v (stderr %q), want figure-1.png", res.ExitCode, res.Artifacts, res.Stderr)
		}
		cc, err := sb.CreateContext(ctx, "python", sbx.ContextOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close(ctx) //nolint:errcheck
		res, err = cc.Run(ctx, code+"None", opts)
		if err != nil || len(res.Artifacts) != 1 || res.Artifacts[0].GetMime() != "image/png" {
			t.Errorf("in a context: got %v, %+v", err, res)
		}
	})
	t.Run("cli-out", func(t *testing.T) {
		out := t.TempDir()
		stdout, stderr, code := d.cli("import plotly.graph_objects as go\ngo.Figure(go.Scatter(y=[1, 2])).show()\n",
			"run-code", "--sandbox", sb.ID, "--lang", "python", "--out", out, "-")
		if code != 0 {
			t.Fatalf("sbx run-code: exit %d stdout %q stderr %q", code, stdout, stderr)
		}
		for _, name := range []string{"plotly-1.html", "plotly-1.plotly.json"} {
			b, err := os.ReadFile(filepath.Join(out, name))
			if err != nil || len(b) == 0 {
				t.Errorf("%s: got %d bytes, %v", name, len(b), err)
			}
		}
	})
}
