package integration

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// notifyWriter collects what is written and signals once it contains want.
type notifyWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	once sync.Once
	seen chan struct{}
}

func newNotifyWriter(want string) *notifyWriter {
	return &notifyWriter{want: want, seen: make(chan struct{})}
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *notifyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestEntrypointLogsAndWait: the sandbox's own command's two streams reach
// two followers at once while it prints; one follower that leaves does not
// stop it; the follow ends with its exit; sbx logs and sbx wait read it
// afterwards.
func TestEntrypointLogsAndWait(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{Command: []string{"/bin/sh", "-c",
		`echo out1; echo err1 >&2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo out2; echo err2 >&2; exit 5`}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	leaveCtx, leave := context.WithCancel(ctx)
	leaverOut := newNotifyWriter("out1\n")
	leaverDone := make(chan error, 1)
	go func() {
		_, err := sb.Logs(leaveCtx, sbx.LogsOptions{Follow: true, Stdout: leaverOut})
		leaverDone <- err
	}()
	stayOut, stayErr := newNotifyWriter("out1\n"), newNotifyWriter("err1\n")
	type result struct {
		res *sbx.LogsResult
		err error
	}
	stayDone := make(chan result, 1)
	go func() {
		res, err := sb.Logs(ctx, sbx.LogsOptions{Follow: true, Stdout: stayOut, Stderr: stayErr})
		stayDone <- result{res, err}
	}()
	for _, ch := range []chan struct{}{leaverOut.seen, stayOut.seen, stayErr.seen} {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("followers did not see the first lines: %q %q %q", leaverOut, stayOut, stayErr)
		}
	}
	leave()
	if err := <-leaverDone; err == nil {
		t.Errorf("leaving follower: got no error, want canceled")
	}
	// The command still runs, and goes on when told.
	if err := sb.WriteFile(ctx, "/tmp/go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-stayDone:
	case <-ctx.Done():
		t.Fatal("the follower did not end when the command exited")
	}
	if r.err != nil {
		t.Fatalf("following: %v", r.err)
	}
	if stayOut.String() != "out1\nout2\n" || stayErr.String() != "err1\nerr2\n" {
		t.Errorf("follower: stdout %q stderr %q, want out1 out2 / err1 err2", stayOut, stayErr)
	}
	if r.res.Exit == nil || r.res.Exit.Code != 5 {
		t.Errorf("follower's exit: %+v, want code 5", r.res.Exit)
	}

	out, errOut, code := d.cli("", "wait", sb.ID)
	if code != 0 || out != "5\n" {
		t.Errorf("sbx wait: exit %d, stdout %q, stderr %q; want 5", code, out, errOut)
	}
	out, errOut, code = d.cli("", "logs", sb.ID)
	if code != 0 || out != "out1\nout2\n" || errOut != "err1\nerr2\n" {
		t.Errorf("sbx logs: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The two streams are read apart, so which of the last two lines came
	// last is the agent's reading order.
	if out, errOut, _ := d.cli("", "logs", "--tail", "1", sb.ID); out+errOut != "err2\n" && out+errOut != "out2\n" {
		t.Errorf("sbx logs --tail 1: stdout %q stderr %q, want one last line", out, errOut)
	}
	if out, errOut, _ := d.cli("", "logs", "--since", "1h", sb.ID); out != "out1\nout2\n" || errOut != "err1\nerr2\n" {
		t.Errorf("sbx logs --since 1h: stdout %q stderr %q, want everything", out, errOut)
	}

	// A sandbox without a command says so.
	plain, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(plain.ID)
	if _, err := plain.Wait(ctx); !sbx.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "no command") {
		t.Errorf("wait without a command: got %v, want FailedPrecondition naming no command", err)
	}
}

// TestEntrypointCannotStart: a command that cannot start fails the create
// with an error naming it, and leaves no sandbox, box or record behind.
func TestEntrypointCannotStart(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	c := d.client()
	for _, tc := range []struct {
		name string
		opts sbx.CreateOptions
		want string
	}{
		{"missing binary", sbx.CreateOptions{Command: []string{"no-such-binary-xyz", "arg"}}, "no-such-binary-xyz"},
		{"missing path", sbx.CreateOptions{Command: []string{"/opt/nothing/here"}}, "/opt/nothing/here"},
		{"workdir is a file", sbx.CreateOptions{Command: []string{"true"}, Workdir: "/etc/hostname"}, "/etc/hostname"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Create(ctx, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: got %v, want an error naming %q", err, tc.want)
			}
			list, err := c.List(ctx)
			if err != nil || len(list) != 0 {
				t.Errorf("sandboxes after the failed create: %d, %v; want none", len(list), err)
			}
		})
	}
	_, errOut, code := d.cli("", "create", "--", "no-such-binary-xyz")
	if code == 0 || !strings.Contains(errOut, "no-such-binary-xyz") {
		t.Errorf("sbx create of a missing binary: exit %d, stderr %q; want a failure naming it", code, errOut)
	}
	d.assertNoLeaks()
}

// TestEntrypointOfImage: an image's ENTRYPOINT and CMD run when no command
// is given, a given command replaces CMD, and --no-entrypoint runs neither.
func TestEntrypointOfImage(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/test/ep:1"
	img := tinyImage(t)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Entrypoint = []string{"/bin/sh", "-c", `echo "ep:$*"; echo "in $(pwd)" >&2`, "ep"}
	cf.Config.Cmd = []string{"from-cmd"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := d.cli("", "pull", ref); code != 0 {
		t.Fatalf("sbx pull: %s", errOut)
	}
	c := d.client()
	for _, tc := range []struct {
		name       string
		opts       sbx.CreateOptions
		wantOut    string // "" with wantNone
		wantNone   bool
		wantStderr string
	}{
		{"entrypoint and cmd", sbx.CreateOptions{Image: ref}, "ep:from-cmd\n", false, "in /srv\n"},
		{"command replaces cmd", sbx.CreateOptions{Image: ref, Command: []string{"given", "args"}}, "ep:given args\n", false, "in /srv\n"},
		{"no entrypoint", sbx.CreateOptions{Image: ref, NoEntrypoint: true}, "", true, ""},
		{"no entrypoint with a command", sbx.CreateOptions{Image: ref, NoEntrypoint: true, Command: []string{"/bin/sh", "-c", "echo alone"}}, "alone\n", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := c.Create(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			d.remember(sb.ID)
			defer sb.Destroy(ctx) //nolint:errcheck
			st, err := sb.Wait(ctx)
			if tc.wantNone {
				if !sbx.IsFailedPrecondition(err) || len(sb.Info.GetCommand()) != 0 {
					t.Errorf("wait: got %v, command %q; want FailedPrecondition and no command", err, sb.Info.GetCommand())
				}
				return
			}
			if err != nil || st.Code != 0 {
				t.Fatalf("wait: %+v, %v; want exit 0", st, err)
			}
			var out, errb bytes.Buffer
			if _, err := sb.Logs(ctx, sbx.LogsOptions{Stdout: &out, Stderr: &errb}); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.wantOut || errb.String() != tc.wantStderr {
				t.Errorf("logs: stdout %q stderr %q, want %q %q", out.String(), errb.String(), tc.wantOut, tc.wantStderr)
			}
		})
	}
	// The CLI's opt-out.
	id, errOut, code := d.cli("", "create", "--image", ref, "--no-entrypoint")
	if code != 0 {
		t.Fatalf("sbx create --no-entrypoint: %s", errOut)
	}
	id = strings.TrimSpace(id)
	d.remember(id)
	if _, errOut, code := d.cli("", "wait", id); code == 0 || !strings.Contains(errOut, "no command") {
		t.Errorf("sbx wait of a --no-entrypoint sandbox: exit %d, stderr %q; want a failure saying it has no command", code, errOut)
	}
}

// TestEntrypointLogsBounded: a command flooding its output keeps only the
// newest 1 MiB of each stream in the sandbox (the rest dropped and counted,
// and said by sbx logs), and nothing of it reaches a file on the host.
func TestEntrypointLogsBounded(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 2*time.Minute)
	const total = 8 << 20
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"/bin/sh", "-c",
		`head -c 8388604 /dev/zero | tr '\0' e; printf LAST; head -c 3000000 /dev/zero | tr '\0' f >&2`}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if st, err := sb.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("wait: %+v, %v", st, err)
	}
	var out, errb bytes.Buffer
	res, err := sb.Logs(ctx, sbx.LogsOptions{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	const kept = 1 << 20
	if out.Len() != kept || !strings.HasSuffix(out.String(), "eLAST") || errb.Len() != kept {
		t.Errorf("logs: %d bytes of stdout (...%q), %d of stderr; want %d each, stdout ending in eLAST",
			out.Len(), out.String()[max(0, out.Len()-8):], errb.Len(), kept)
	}
	if res.DroppedStdout != total-kept || res.DroppedStderr != 3000000-kept {
		t.Errorf("dropped: %d and %d, want %d and %d", res.DroppedStdout, res.DroppedStderr, total-kept, 3000000-kept)
	}
	_, errOut, code := d.cli("", "logs", "--tail", "0", sb.ID)
	if code != 0 || !strings.Contains(errOut, "dropped") {
		t.Errorf("sbx logs: exit %d, stderr %q; want it to say bytes were dropped", code, errOut)
	}
	// Nothing of the flood went to the host's files.
	filepath.Walk(d.dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && filepath.Base(p) == "agent.log" && fi.Size() > 256<<10 {
			t.Errorf("%s is %d bytes: the command's output reached the host", p, fi.Size())
		}
		return nil
	})
}
