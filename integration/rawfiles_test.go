package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// The raw file route (internal/server's FilesPath, agent protocol 6): file
// bytes spliced between the client's connection, the daemon, the agent and
// the file. These drive it directly over HTTP (so that the route is what
// is tested, whatever the SDK picks) and through the SDK and `sbx cp`.

const rawFilesPath = "/sbx/v1/files"

// rawURL is the raw route of daemon d for sandbox id and path, with extra
// query parameters.
func rawURL(d *daemon, id, path string, extra ...string) string {
	q := url.Values{"sandbox": {id}, "path": {path}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return "http://" + d.addr + rawFilesPath + "?" + q.Encode()
}

// rawPut uploads size bytes of body to path over the raw route and returns
// the status and the answer's body.
func rawPut(t *testing.T, ctx context.Context, d *daemon, id, path string, body io.Reader, size int64, extra ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, rawURL(d, id, path, extra...), io.NopCloser(body))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Expect", "100-continue")
	tr := &http.Transport{ExpectContinueTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatalf("PUT %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestRawFileTransfers moves files through the raw route, the SDK and
// `sbx cp` and checks them byte for byte in the box and back: random data
// of odd sizes, a sparse file made in the box (holes read as zeros), a
// sparse file copied in from the host, ranges, and a procfs file (no
// length up front: answered from the ReadFile stream).
func TestRawFileTransfers(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)

	// Raw PUT, then the box's own sha256sum and a raw GET.
	data := make([]byte, 48<<20+7)
	rand.Read(data)
	if code, body := rawPut(t, ctx, d, sb.ID, "/tmp/raw.bin", bytes.NewReader(data), int64(len(data)), "mode", "600"); code != http.StatusOK || !strings.Contains(body, strconv.Itoa(len(data))) {
		t.Fatalf("PUT: got %d %q, want 200 with bytes_written %d", code, body, len(data))
	}
	if got := mustRun(t, ctx, sb, "sha256sum < /tmp/raw.bin | cut -d' ' -f1; stat -c %a /tmp/raw.bin"); got != sha(data)+"\n600\n" {
		t.Errorf("in the box: got %q, want the sha256 of what was sent and mode 600", got)
	}
	resp, err := http.Get(rawURL(d, sb.ID, "/tmp/raw.bin"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(data)) || !bytes.Equal(got, data) {
		t.Fatalf("GET: status %d, Content-Length %d, %d bytes, %v; want 200 and the %d bytes sent", resp.StatusCode, resp.ContentLength, len(got), err, len(data))
	}
	resp, err = http.Get(rawURL(d, sb.ID, "/tmp/raw.bin", "offset", "5", "length", "10"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got, data[5:15]) {
		t.Errorf("GET offset 5 length 10: got %x, want %x", got, data[5:15])
	}

	// The SDK: an upload of a known size and a download.
	if _, err := sb.Upload(ctx, "/tmp/sdk.bin", bytes.NewReader(data[:20<<20]), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := sb.Download(ctx, "/tmp/sdk.bin", &buf); err != nil || !bytes.Equal(buf.Bytes(), data[:20<<20]) {
		t.Fatalf("SDK round trip: %d bytes, %v; want the 20 MiB sent", buf.Len(), err)
	}

	// A sparse file made in the box: its holes come out as zeros.
	mustRun(t, ctx, sb, "printf head > /tmp/sparse && truncate -s 96M /tmp/sparse && printf tail >> /tmp/sparse")
	want := make([]byte, 96<<20+4)
	copy(want, "head")
	copy(want[96<<20:], "tail")
	buf.Reset()
	if err := sb.Download(ctx, "/tmp/sparse", &buf); err != nil || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("sparse download: %d bytes, %v; want %d: head, zeros, tail", buf.Len(), err, len(want))
	}

	// `sbx cp` in and out with a sparse host file.
	dir := t.TempDir()
	src := filepath.Join(dir, "sparse-in")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("start"), 0)
	f.WriteAt([]byte("end"), 40<<20)
	f.Close()
	srcData, _ := os.ReadFile(src)
	if _, errOut, code := d.cli("", "cp", src, sb.ID+":/tmp/cp.bin"); code != 0 {
		t.Fatalf("sbx cp in: exit %d: %s", code, errOut)
	}
	if got := mustRun(t, ctx, sb, "sha256sum < /tmp/cp.bin | cut -d' ' -f1"); got != sha(srcData)+"\n" {
		t.Errorf("sbx cp in: the box's file hashes to %q, want %s", got, sha(srcData))
	}
	out := filepath.Join(dir, "out")
	if _, errOut, code := d.cli("", "cp", sb.ID+":/tmp/cp.bin", out); code != 0 {
		t.Fatalf("sbx cp out: exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, srcData) {
		t.Errorf("sbx cp out: %d bytes differing from the %d copied in", len(b), len(srcData))
	}

	// procfs: no length up front, answered from the ReadFile stream.
	b, err := sb.ReadFile(ctx, "/proc/version")
	if err != nil || !strings.HasPrefix(string(b), "Linux version") {
		t.Errorf("ReadFile /proc/version: got %q, %v; want the kernel's version", b, err)
	}
}

// TestRawFileRefused: the raw route applies the file API's rules (a box's
// path permissions, the agent's own /proc) and its own input checks, with
// the Connect code as JSON, before reading any of the body (100-continue).
func TestRawFileRefused(t *testing.T) {
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
	for _, tc := range []struct {
		name, id, path string
		extra          []string
		wantStatus     int
		wantCode       string
	}{
		{"view-only file", sb.ID, "/workspace/README", nil, http.StatusForbidden, "permission_denied"},
		{"read-only directory", sb.ID, "/workspace/src/evil", nil, http.StatusForbidden, "permission_denied"},
		{"hidden file", sb.ID, "/workspace/.env", nil, 0, ""},
		{"the agent's /proc", sb.ID, "/proc/1/environ", nil, http.StatusForbidden, "permission_denied"},
		{"bad mode", sb.ID, "/tmp/x", []string{"mode", "rw"}, http.StatusBadRequest, "invalid_argument"},
		{"unknown sandbox", "sb-nosuch", "/tmp/x", nil, http.StatusNotFound, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := 0
			body := readerFunc(func(p []byte) (int, error) { read += len(p); return len(p), nil })
			code, answer := rawPut(t, ctx, d, tc.id, tc.path, body, 4<<20, tc.extra...)
			if code == http.StatusOK {
				t.Fatalf("PUT %s: got 200 %q, want a refusal", tc.path, answer)
			}
			if tc.wantStatus != 0 && (code != tc.wantStatus || !strings.Contains(answer, `"code":"`+tc.wantCode+`"`)) {
				t.Errorf("PUT %s: got %d %q, want %d with code %s", tc.path, code, answer, tc.wantStatus, tc.wantCode)
			}
			if read != 0 {
				t.Errorf("PUT %s: the client sent %d bytes of a refused body, want 0 (100-continue)", tc.path, read)
			}
		})
	}
	for _, p := range []string{"/workspace/.env", "/workspace/README", "/proc/1/environ"} {
		resp, err := http.Get(rawURL(d, sb.ID, p))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "SECRET") || strings.Contains(string(b), "hello") {
			t.Errorf("GET %s: got %d %q, want a refusal", p, resp.StatusCode, b)
		}
	}
	if got := mustRun(t, ctx, sb, "stat -c %s /workspace/README; ls /workspace/src"); got != "6\nmain.go\n" {
		t.Errorf("after the refused writes: got %q, want README and src unchanged", got)
	}
	// A chunked upload (no Content-Length) is refused, naming it.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, rawURL(d, sb.ID, "/tmp/x"), io.NopCloser(strings.NewReader("x")))
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "Content-Length") {
		t.Errorf("chunked PUT: got %d %q, want 400 naming Content-Length", resp.StatusCode, b)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// noTemp fails if dir in sb holds a file writer's temporary file.
func noTemp(t *testing.T, ctx context.Context, sb *sbx.Sandbox, dir string) {
	t.Helper()
	if got := mustRun(t, ctx, sb, "ls -a "+dir+" | grep -c '\\.sbx-' || true"); got != "0\n" {
		t.Errorf("%s holds %s temporary files, want none", dir, strings.TrimSpace(got))
	}
}

// TestRawFileDiskFull: an upload larger than the box's disk fails with
// ResourceExhausted naming the disk, through the raw route and the SDK,
// leaves no partial or temporary file, and the box and the daemon are as
// before.
func TestRawFileDiskFull(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{MemoryBytes: 512 << 20, DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	mustRun(t, ctx, sb, "echo old > /tmp/f")
	baseFDs := fdCount(t, d.cmd.Process.Pid)
	data := make([]byte, 96<<20)
	_, err = sb.Upload(ctx, "/tmp/f", bytes.NewReader(data), 0o644)
	if got := connect.CodeOf(err); got != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "no space") {
		t.Errorf("SDK upload of 96 MiB into a 64 MiB disk: got %v (%v), want ResourceExhausted naming the full disk", got, err)
	}
	code, body := rawPut(t, ctx, d, sb.ID, "/tmp/g", bytes.NewReader(data), int64(len(data)))
	if code != http.StatusTooManyRequests || !strings.Contains(body, "resource_exhausted") {
		t.Errorf("raw PUT of 96 MiB into a 64 MiB disk: got %d %q, want 429 resource_exhausted", code, body)
	}
	if got := mustRun(t, ctx, sb, "cat /tmp/f; ls /tmp/g 2>&1 >/dev/null | grep -c 'No such' "); got != "old\n1\n" {
		t.Errorf("after the failed uploads: got %q, want f unchanged and no g", got)
	}
	noTemp(t, ctx, sb, "/tmp")
	// The disk is free again: a file that fits goes in.
	if _, err := sb.Upload(ctx, "/tmp/h", bytes.NewReader(data[:16<<20]), 0o644); err != nil {
		t.Errorf("16 MiB upload after the failures: %v", err)
	}
	waitFDs(t, d.cmd.Process.Pid, baseFDs+4)
}

// TestRawFileBoxGoneMidTransfer destroys a box while an upload and a
// download are under way: both fail (the download's body ends short of its
// Content-Length, never looking complete), promptly, and the daemon lets go
// of every socket and pipe of them; nothing of the box is left. A client
// that leaves mid-upload leaves no file either.
func TestRawFileBoxGoneMidTransfer(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	c.Close()
	baseFDs := fdCount(t, d.cmd.Process.Pid)

	// A client that leaves after 8 MiB of 256: no file, no temporary one.
	mustRun(t, ctx, sb, "echo old > /tmp/left")
	nc, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(rawURL(d, sb.ID, "/tmp/left"))
	fmt.Fprintf(nc, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", u.RequestURI(), d.addr, 256<<20)
	nc.Write(make([]byte, 8<<20))
	nc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := mustRun(t, ctx, sb, "cat /tmp/left; ls -a /tmp | grep -c '\\.sbx-' || true")
		if got == "old\n0\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the client left: got %q, want /tmp/left unchanged and no temporary file", got)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition the test observes
	}
	waitFDs(t, d.cmd.Process.Pid, baseFDs+4)

	// An upload and a download under way when the box goes.
	mustRun(t, ctx, sb, "head -c 200M /dev/zero > /tmp/big")
	pr, pw := io.Pipe()
	upDone := make(chan error, 1)
	sent := make(chan struct{})
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, rawURL(d, sb.ID, "/tmp/up"), pr)
		req.ContentLength = 256 << 20
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				upDone <- fmt.Errorf("answered 200 %q", b)
				return
			}
			t.Logf("upload across the destroy: %d %s", resp.StatusCode, b)
		} else {
			t.Logf("upload across the destroy: %v", err)
		}
		upDone <- nil
	}()
	go func() {
		pw.Write(make([]byte, 8<<20))
		close(sent)
		pw.Write(make([]byte, 8<<20)) // blocks until the transfer ends
	}()
	<-sent
	resp, err := http.Get(rawURL(d, sb.ID, "/tmp/big"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil || n+1<<20 >= 200<<20 {
		t.Errorf("download across the destroy: got %d more bytes, %v; want an error before the 200 MiB", n, err)
	}
	pw.CloseWithError(io.ErrClosedPipe)
	select {
	case err := <-upDone:
		if err != nil {
			t.Errorf("upload across the destroy: %v, want a failure", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("upload across the destroy: still under way 30 s later")
	}
	// The clients' idle connections (exec, files) are the daemon's too.
	c.Close()
	http.DefaultClient.CloseIdleConnections()
	waitFDs(t, d.cmd.Process.Pid, baseFDs)
	d.assertNoLeaks()
}
