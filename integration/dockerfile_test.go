package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestDockerfileBuild builds a Dockerfile with the CLI on a real daemon:
// its FROM (a loopback registry's image the daemon does not have) is
// pulled, COPY reads the context minus .dockerignore, a symlink in the
// context is copied as a link (never followed on the host; one leading
// out of what is copied is refused), ARGs reach
// RUN, and a sandbox created from the result runs with the Dockerfile's
// env, workdir and user. Unsupported or escaping instructions fail naming
// the line.
func TestDockerfileBuild(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	reg := startCountingRegistry(t)
	base := reg.host + "/df/base:1"
	pushImage(t, base, toolImage(t))

	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"Dockerfile": `# syntax=docker/dockerfile:1
ARG BASE
FROM ${BASE}
ARG WHO=nobody
ENV GREETING="hello there"
WORKDIR /app
COPY src/ ./
COPY notes-link notes.txt /links/
RUN echo "built by $WHO" > /app/built.txt && \
    cat /app/main.sh >> /app/built.txt
USER 1000:1000
LABEL org.example.test=yes
EXPOSE 8080
CMD ["cat", "/app/built.txt"]
`,
		".dockerignore":   "**/.cache\nsecret.env\n",
		"src/main.sh":     "echo main\n",
		"src/.cache/big":  "ignored\n",
		"secret.env":      "TOKEN=never-sent\n",
		"notes.txt":       "notes\n",
		"bad/Dockerfile":  "FROM " + base + "\nRUN true\nHEALTHCHECK CMD true\n",
		"bad2/Dockerfile": "FROM " + base + "\nCOPY ../secret.env /x\n",
		"bad3/Dockerfile": "FROM " + base + "\nCOPY passwd-link /x/\n",
	})
	for link, target := range map[string]string{"passwd-link": "/etc/passwd", "notes-link": "notes.txt"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}

	out, errOut, code := d.cli("", "build", "-f", filepath.Join(dir, "Dockerfile"), "-t", "local/df:1",
		"--build-arg", "BASE="+base, "--build-arg", "WHO=the test", dir)
	if code != 0 {
		t.Fatalf("sbx build -f Dockerfile: exit %d\n%s", code, errOut)
	}
	if !strings.HasPrefix(out, "index.docker.io/local/df:1 sha256:") || !strings.Contains(errOut, "pulling "+base) {
		t.Errorf("build: stdout %q, stderr %q; want the image and the FROM's pull", out, errOut)
	}

	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{Image: "local/df:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	got := mustRun(t, ctx, sb, `cat /app/built.txt; echo "$GREETING $(pwd)"; test -e /app/.cache || echo no-cache; `+
		`test -e /app/secret.env || test -e /secret.env || echo no-secret; readlink /links/notes-link; cat /links/notes-link; `+
		`while read k v rest; do [ "$k" = Uid: ] && echo "uid $v"; done < /proc/self/status; true`)
	want := "built by the test\necho main\nhello there /app\nno-cache\nno-secret\nnotes.txt\nnotes\nuid 1000\n"
	if got != want {
		t.Errorf("in the built image: got %q, want %q", got, want)
	}

	// Unchanged: every step comes from the cache.
	_, errOut, code = d.cli("", "build", "-f", filepath.Join(dir, "Dockerfile"), "-t", "local/df:2",
		"--build-arg", "BASE="+base, "--build-arg", "WHO=the test", dir)
	if code != 0 || strings.Count(errOut, "CACHED") != 7 {
		t.Errorf("unchanged rebuild: exit %d, want 7 cached steps:\n%s", code, errOut)
	}

	for _, tc := range []struct{ file, want string }{
		{"bad/Dockerfile", "line 3: HEALTHCHECK is not supported"},
		{"bad2/Dockerfile", `line 2: COPY: source "../secret.env": ".." component`},
		// A link out of what is copied is refused where it would land.
		{"bad3/Dockerfile", `symlink target "/etc/passwd" leaves the destination`},
	} {
		_, errOut, code := d.cli("", "build", "-f", filepath.Join(dir, tc.file), "-t", "local/bad:1", dir)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("build %s: exit %d, stderr %q; want an error containing %q", tc.file, code, errOut, tc.want)
		}
	}
}
