package integration

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// agentHostPIDs returns the host pids of the agents of the running boxes.
func agentHostPIDs(t *testing.T, d *daemon) []int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(d.dataDir, "oci", "boxes", "*", "init.pid"))
	var pids []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		t.Fatal("no agent pid file under the daemon's data dir")
	}
	return pids
}

// TestFileAPIAgentLinks plants, as user code in a guarded box, symlinks to
// the agent's own /proc/1/fd/N (N: every fd the agent has, the guard's
// backing tree among them), environ, mem, its log (fd 1), root and cwd,
// then drives every file API call through them. Nothing hidden or private
// to the agent may come back, read-only files must stay unchanged and
// hidden files must still exist (checked from a second, unguarded box on
// the same volume).
func TestFileAPIAgentLinks(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	vol := permTree(t, d)

	sb, err := c.Create(ctx, sbx.CreateOptions{
		Volumes:      []sbx.VolumeMount{{Volume: vol, Path: "/workspace"}},
		PathPolicies: []sbx.PathPolicy{agentSafeGuard},
		Command:      []string{"sleep", "600"},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	// The agent's real fds, its environ and its log, read on the host.
	pids := agentHostPIDs(t, d)
	if len(pids) != 1 {
		t.Fatalf("agents running: %v, want one", pids)
	}
	hostPID := strconv.Itoa(pids[0])
	ents, err := os.ReadDir("/proc/" + hostPID + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range ents {
		fds = append(fds, e.Name())
	}
	environ, err := os.ReadFile("/proc/" + hostPID + "/environ")
	if err != nil || len(environ) == 0 {
		t.Fatalf("agent's environ on the host: %q, %v", environ, err)
	}
	envLine, _, _ := bytes.Cut(environ, []byte{0})
	logs, _ := filepath.Glob(filepath.Join(d.dataDir, "oci", "boxes", "*", "agent.log"))
	if len(logs) != 1 {
		t.Fatalf("agent logs: %v, want one", logs)
	}
	agentLog, err := os.ReadFile(logs[0])
	if err != nil || len(agentLog) == 0 {
		t.Fatalf("agent log: %q, %v", agentLog, err)
	}
	logLine, _, _ := bytes.Cut(agentLog, []byte("\n"))
	// secret reports what private content b holds, if any.
	secret := func(b []byte) string {
		switch {
		case bytes.Contains(b, []byte("SECRET=1")):
			return "the hidden .env"
		case bytes.Contains(b, []byte("s\n")) && len(b) == 2:
			return "the hidden secrets/x"
		case len(envLine) > 3 && bytes.Contains(b, envLine):
			return "the agent's environ"
		case len(logLine) > 3 && bytes.Contains(b, logLine):
			return "the agent's log"
		}
		return ""
	}

	// User code plants the links.
	plant := []string{"cd /workspace/output"}
	links := map[string]string{
		"environ":      "/proc/1/environ",
		"self-environ": "/proc/self/environ",
		"mem":          "/proc/1/mem",
		"log":          "/proc/1/fd/1",
		"selfroot":     "/proc/self/root/workspace/.env",
		"root":         "/proc/1/root/workspace/.env",
		"cwd":          "/proc/1/cwd",
		"maps":         "/proc/1/maps",
	}
	for _, n := range fds {
		links["fd"+n] = "/proc/1/fd/" + n
		links["fd"+n+".env"] = "/proc/1/fd/" + n + "/.env"
	}
	names := make([]string, 0, len(links))
	for name, target := range links {
		plant = append(plant, fmt.Sprintf("ln -sfn %s %s", target, name))
		names = append(names, name)
	}
	sort.Strings(names)
	mustRun(t, ctx, sb, strings.Join(plant, " && "))

	W := "/workspace/output/"
	for _, name := range names {
		p := W + name
		if b, err := sb.ReadFile(ctx, p); err == nil || secret(b) != "" {
			t.Errorf("read %s (-> %s): got %d bytes (%s), err %v; want an error", p, links[name], len(b), secret(b), err)
		}
		// By the target's own path too (the agent is PID 1).
		if b, err := sb.ReadFile(ctx, links[name]); err == nil || secret(b) != "" {
			t.Errorf("read %s: got %d bytes (%s), err %v; want an error", links[name], len(b), secret(b), err)
		}
	}
	for _, n := range fds {
		dir := W + "fd" + n
		for _, p := range []string{dir + "/.env", dir + "/secrets/x", dir + "/src/main.go"} {
			if b, err := sb.ReadFile(ctx, p); err == nil || secret(b) != "" {
				t.Errorf("read %s: got %q, err %v; want an error", p, b, err)
			}
			if _, err := sb.Stat(ctx, p); err == nil {
				t.Errorf("stat %s: succeeded, want an error", p)
			}
		}
		if ents, err := sb.ListDir(ctx, dir, true, 0); err == nil {
			t.Errorf("list %s: got %d entries, want an error", dir, len(ents))
		}
		if err := sb.WriteFile(ctx, dir+"/src/main.go", []byte("pwned\n"), 0o644); err == nil {
			t.Errorf("write %s/src/main.go: succeeded", dir)
		}
		if err := sb.MakeDir(ctx, dir+"/secrets/made", true); err == nil {
			t.Errorf("mkdir %s/secrets/made: succeeded", dir)
		}
		if err := sb.Rename(ctx, dir+"/a.key", W+"stolen.key"); err == nil {
			t.Errorf("rename %s/a.key: succeeded", dir)
		}
		if err := sb.Remove(ctx, dir+"/.env", false); err == nil {
			t.Errorf("remove %s/.env: succeeded", dir)
		}
		if err := sb.Remove(ctx, dir+"/secrets", true); err == nil {
			t.Errorf("remove -r %s/secrets: succeeded", dir)
		}
		var tb bytes.Buffer
		if err := sb.DownloadTar(ctx, dir+"/secrets", &tb); err == nil || secret(tb.Bytes()) != "" {
			t.Errorf("download tar of %s/secrets: got %d bytes (%s), err %v; want an error", dir, tb.Len(), secret(tb.Bytes()), err)
		}
		if _, err := sb.UploadTar(ctx, dir+"/src", bytes.NewReader(oneFileTar(t, "main.go", "pwned\n"))); err == nil {
			t.Errorf("upload tar to %s/src: succeeded", dir)
		}
	}
	// The whole output directory: links come back as links, nothing else.
	var tb bytes.Buffer
	if err := sb.DownloadTar(ctx, "/workspace/output", &tb); err != nil {
		t.Fatalf("download tar of /workspace/output: %v", err)
	}
	if s := secret(tb.Bytes()); s != "" {
		t.Errorf("download tar of /workspace/output holds %s", s)
	}
	// The CLI's cp (DownloadTar of a single link) writes no secret either.
	dst := filepath.Join(t.TempDir(), "got")
	d.cli("", "cp", sb.ID+":"+W+"fd"+fds[len(fds)-1]+".env", dst)
	if b, _ := os.ReadFile(dst); secret(b) != "" {
		t.Errorf("sbx cp of a planted link wrote %s", secret(b))
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	// The guarded tree itself, seen unguarded: unchanged, nothing missing.
	check, err := c.Create(ctx, sbx.CreateOptions{Volumes: []sbx.VolumeMount{{Volume: vol, Path: "/t"}}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(check.ID)
	res, err := check.RunShell(ctx, "cd /t && cat .env secrets/x a.key src/main.go; ls secrets; ls src; ls -a . | grep -v lost+found | tr '\\n' ' '")
	if err != nil {
		t.Fatal(err)
	}
	got := string(res.Stdout)
	want := "SECRET=1\ns\nk\npackage main\nx\nmain.go\n. .. .env README a.key output secrets src "
	if got != want {
		t.Errorf("the guarded tree afterwards:\ngot  %q\nwant %q", got, want)
	}
	if err := check.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveVolume(ctx, vol); err != nil {
		t.Errorf("removing volume: %v", err)
	}
	d.assertNoLeaks()
}

// oneFileTar is an archive of one regular file.
func oneFileTar(t *testing.T, name, data string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(data))
	tw.Close()
	return b.Bytes()
}
