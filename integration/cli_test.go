package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestCLIHabits drives the built CLI: --json and -q on the listing
// commands, completion of sandbox names, exec without --, docker-like cp and
// error messages that name each thing once.
func TestCLIHabits(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{Name: "habits"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	cli := func(t *testing.T, args ...string) string {
		t.Helper()
		out, errOut, code := d.cli("", args...)
		if code != 0 {
			t.Fatalf("sbx %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out
	}

	t.Run("json", func(t *testing.T) {
		var boxes []map[string]any
		if err := json.Unmarshal([]byte(cli(t, "ls", "--json")), &boxes); err != nil || len(boxes) != 1 {
			t.Fatalf("ls --json: got %d boxes, %v; want 1", len(boxes), err)
		}
		b := boxes[0]
		if b["id"] != sb.ID || b["state"] != "running" {
			t.Errorf("ls --json: id %v state %v, want %s running", b["id"], b["state"], sb.ID)
		}
		if _, ok := b["createdAtMs"].(float64); !ok {
			t.Errorf("ls --json: createdAtMs is %T (%v), want a number", b["createdAtMs"], b["createdAtMs"])
		}
		if _, ok := b["created_at_ms"]; ok {
			t.Error("ls --json: snake_case field names, want the JSON API's camelCase")
		}
		if got := strings.TrimSpace(cli(t, "ls", "-q")); got != sb.ID {
			t.Errorf("ls -q: got %q, want %q", got, sb.ID)
		}
		if _, err := sb.CreateSession(ctx, sbx.SessionOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"images", "ls"}, {"volume", "ls"}, {"codebase", "ls"}, {"session", "ls"}, {"context", "ls"}, {"port", sb.ID},
		} {
			var list []map[string]any
			out := cli(t, append(args, "--json")...)
			if err := json.Unmarshal([]byte(out), &list); err != nil {
				t.Errorf("sbx %s --json: %v:\n%s", strings.Join(args, " "), err, out)
			}
			cli(t, append(args, "-q")...)
		}
		var sessions []map[string]any
		_ = json.Unmarshal([]byte(cli(t, "session", "ls", "--json")), &sessions)
		if len(sessions) != 1 || sessions[0]["sandbox"] != sb.ID {
			t.Errorf("session ls --json: got %v, want one session of %s", sessions, sb.ID)
		}
		if _, ok := sessions[0]["execs"].(float64); !ok {
			t.Errorf("session ls --json: execs is %T, want a number", sessions[0]["execs"])
		}
	})

	t.Run("completion", func(t *testing.T) {
		for _, args := range [][]string{{"exec", ""}, {"rm", sb.ID, ""}, {"logs", "ha"}} {
			out := cli(t, append([]string{"__complete"}, args...)...)
			if !strings.Contains(out, "habits\trunning") {
				t.Errorf("completing sbx %s: got %q, want the name habits described as running", strings.Join(args, " "), out)
			}
		}
		if out := cli(t, "__complete", "cp", "hab"); !strings.Contains(out, "habits:") {
			t.Errorf("completing cp: got %q, want habits:", out)
		}
		if _, err := c.CreateVolume(ctx, "habitvol", 16<<20); err != nil {
			t.Fatal(err)
		}
		if out := cli(t, "__complete", "create", "--volume", "habit"); !strings.Contains(out, "habitvol:") {
			t.Errorf("completing create --volume: got %q, want habitvol:", out)
		}
		if err := c.RemoveVolume(ctx, "habitvol"); err != nil {
			t.Error(err)
		}
		if out := cli(t, "__complete", "exec", sb.ID, ""); strings.Contains(out, "habits") {
			t.Errorf("completing the command after the sandbox offered sandboxes: %q", out)
		}
	})

	t.Run("exec-without-dashes", func(t *testing.T) {
		if got := cli(t, "exec", "habits", "python3", "-c", "import sys; print(sys.argv[1:])", "-x", "--y"); got != "['-x', '--y']\n" {
			t.Errorf("exec without --: got %q", got)
		}
		if got := cli(t, "exec", "-w", "/tmp", "habits", "--", "sh", "-c", "pwd"); got != "/tmp\n" {
			t.Errorf("exec with -w and --: got %q", got)
		}
	})

	t.Run("cp", func(t *testing.T) {
		local := t.TempDir()
		proj := filepath.Join(local, "proj")
		os.MkdirAll(filepath.Join(proj, "sub"), 0o755)
		os.WriteFile(filepath.Join(proj, "sub", "f"), []byte("data"), 0o644)
		if _, err := sb.Run(ctx, "mkdir", "-p", "/root/exists"); err != nil {
			t.Fatal(err)
		}
		boxCat := func(p string) string {
			res, err := sb.Run(ctx, "cat", p)
			if err != nil {
				t.Fatal(err)
			}
			return string(res.Stdout)
		}
		// In, onto an existing directory: it lands inside.
		cli(t, "cp", proj, "habits:/root/exists")
		if got := boxCat("/root/exists/proj/sub/f"); got != "data" {
			t.Errorf("cp DIR box:EXISTING: /root/exists/proj/sub/f = %q, want data", got)
		}
		// In, onto a new path: the directory becomes it.
		cli(t, "cp", proj, "habits:/root/new")
		if got := boxCat("/root/new/sub/f"); got != "data" {
			t.Errorf("cp DIR box:NEW: /root/new/sub/f = %q, want data", got)
		}
		// Out, onto an existing directory.
		out := filepath.Join(local, "out")
		os.Mkdir(out, 0o755)
		cli(t, "cp", "habits:/root/new", out+"/")
		if b, err := os.ReadFile(filepath.Join(out, "new", "sub", "f")); string(b) != "data" {
			t.Errorf("cp box:DIR EXISTING/: out/new/sub/f = %q, %v; want data", b, err)
		}
		// Out, onto a new path.
		fresh := filepath.Join(local, "fresh")
		cli(t, "cp", "habits:/root/new", fresh)
		if b, err := os.ReadFile(filepath.Join(fresh, "sub", "f")); string(b) != "data" {
			t.Errorf("cp box:DIR NEW: fresh/sub/f = %q, %v; want data", b, err)
		}
		// DIR/. copies the contents, both ways.
		cli(t, "cp", "habits:/root/new/.", out)
		if b, err := os.ReadFile(filepath.Join(out, "sub", "f")); string(b) != "data" {
			t.Errorf("cp box:DIR/. EXISTING: out/sub/f = %q, %v; want data", b, err)
		}
		cli(t, "cp", proj+"/.", "habits:/root/exists")
		if got := boxCat("/root/exists/sub/f"); got != "data" {
			t.Errorf("cp DIR/. box:EXISTING: /root/exists/sub/f = %q, want data", got)
		}
	})

	t.Run("errors-name-things-once", func(t *testing.T) {
		for _, args := range [][]string{
			{"cp", "habits:/nope", t.TempDir()},
			{"exec", "habits", "--", "true"}, // fine; a control
			{"exec", "nope", "true"},
			{"inspect", "nope"},
			{"create", "--image", "nope/nope:1"},
			{"snapshot", "habits", "-t", "BAD REF"},
			{"network", "habits", "--mode", "bogus"},
			{"images", "rm", "nope"},
			{"volume", "rm", "nope"},
			{"codebase", "rm", "nope"},
			{"session", "exec", "nope", "ls"},
			{"context", "rm", "nope"},
		} {
			_, errOut, code := d.cli("", args...)
			if args[1] == "habits" && args[0] == "exec" {
				if code != 0 {
					t.Errorf("control: sbx %v: exit %d %s", args, code, errOut)
				}
				continue
			}
			if code == 0 || errOut == "" {
				t.Errorf("sbx %s: exit %d, stderr %q; want a failure", strings.Join(args, " "), code, errOut)
				continue
			}
			line := strings.TrimSpace(strings.TrimPrefix(errOut, "sbx: "))
			segs := strings.Split(line, ": ")
			for i := 1; i < len(segs); i++ {
				if segs[i] == segs[i-1] {
					t.Errorf("sbx %s: %q repeats %q", strings.Join(args, " "), line, segs[i])
				}
			}
			if args[0] == "snapshot" && strings.Count(line, sb.ID) > 1 {
				t.Errorf("sbx snapshot: %q names the sandbox twice", line)
			}
			if args[0] == "network" && !strings.Contains(line, `"bogus"`) {
				t.Errorf("sbx network --mode bogus: %q does not name the bad mode", line)
			}
		}
	})
}
