package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// The daemon's defaults (server.DefaultExecsPerSandbox and
// DefaultFilesPerSandbox); the test runs against a default daemon.
const (
	defaultExecStreams = 256
	defaultFileStreams = 64
)

// TestStreamFloodStaysInItsSandbox floods one box with exec and file
// streams — far more than its limits, file reads whose client never reads
// — and checks that the excess is refused with ResourceExhausted naming the
// limit, that the daemon's agent sockets and memory stay bounded, that a
// neighbour's exec and file calls keep working while it lasts, and that the
// box itself works again afterwards.
func TestStreamFloodStaysInItsSandbox(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	// Room for a thousand processes: the daemon's bound, not the box's
	// pids limit, must be what holds.
	attacker := newBox(t, ctx, d, sbx.CreateOptions{Name: "flooder", Pids: 2048, MemoryBytes: 1 << 30, Timeout: 10 * time.Minute})
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{Name: "neighbour", Timeout: 10 * time.Minute})
	pid := d.cmd.Process.Pid
	rss0 := vmRSS(t, pid)

	t.Run("file reads nobody reads", func(t *testing.T) {
		const rssBound = 256 // MiB
		// 200 streams, not thousands: on a daemon without the bound each
		// buffers megabytes, and the test must not take the machine down.
		const n = 200
		fctx, cancel := context.WithCancel(ctx)
		defer cancel()
		hc := slowReader()
		url := "http://" + d.addr + sbxv1connect.SandboxServiceReadFileProcedure
		var admitted, refused atomic.Int32
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := connect.NewClient[sbxv1.ReadFileRequest, sbxv1.FileChunk](hc, url, connect.WithGRPC())
				st, err := c.CallServerStream(fctx, connect.NewRequest(&sbxv1.ReadFileRequest{Sandbox: attacker.ID, Path: "/dev/zero"}))
				if err == nil && st.Receive() {
					admitted.Add(1)
					<-fctx.Done() // hold the stream, read nothing more
					st.Close()
					return
				}
				if err == nil {
					err = st.Err()
				}
				if connect.CodeOf(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), "--file-max-streams") {
					refused.Add(1)
					return
				}
				errs <- err
			}()
		}
		waitUntil(t, 60*time.Second, func() bool { return admitted.Load()+refused.Load()+int32(len(errs)) == n },
			func() string { return fmt.Sprintf("%d admitted, %d refused of %d", admitted.Load(), refused.Load(), n) })
		// The agent keeps sending until every stalled stream's buffers
		// are full: wait for the daemon's memory to settle (or to pass
		// the bound).
		rss := settledRSS(t, pid, rss0+rssBound)
		t.Logf("file reads: %d relayed, %d refused; daemon RSS %d MiB, was %d", admitted.Load(), refused.Load(), rss, rss0)
		if len(errs) > 0 {
			t.Fatalf("a flooding read failed other than with ResourceExhausted naming --file-max-streams: %v", <-errs)
		}
		if got := admitted.Load(); got > defaultFileStreams {
			t.Errorf("%d file reads of one box were relayed at once, want at most %d", got, defaultFileStreams)
		}
		// What the daemon holds for the stalled reads is bounded: about
		// 2 MiB each (a flow-control window and the message being relayed).
		if grew := rss - rss0; grew > rssBound {
			t.Errorf("daemon RSS grew by %d MiB while %d file reads stalled, want at most %d", grew, admitted.Load(), rssBound)
		}
		neighbourWorks(t, neighbour)
		cancel()
		wg.Wait()
	})

	t.Run("a thousand commands", func(t *testing.T) {
		const n = 1000
		fctx, cancel := context.WithCancel(ctx)
		defer cancel()
		c := d.client()
		defer c.Close()
		sb := c.Sandbox(attacker.ID)
		var started, refused atomic.Int32
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := &firstByte{f: func() { started.Add(1) }}
				_, err := sb.Exec(fctx, sbx.ExecOptions{Shell: "echo up; exec sleep 600", Stdout: out})
				switch {
				case fctx.Err() != nil:
				case sdkCode(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), "--exec-max-streams"):
					refused.Add(1)
				default:
					errs <- fmt.Errorf("exec: %v", err)
				}
			}()
		}
		waitUntil(t, 120*time.Second, func() bool { return started.Load()+refused.Load()+int32(len(errs)) == n },
			func() string { return fmt.Sprintf("%d running, %d refused of %d", started.Load(), refused.Load(), n) })
		socks := unixSockets(t, pid)
		t.Logf("commands: %d running, %d refused; daemon Unix sockets %d, RSS %d MiB", started.Load(), refused.Load(), socks, vmRSS(t, pid))
		if len(errs) > 0 {
			t.Fatalf("a flooding exec failed other than with ResourceExhausted naming --exec-max-streams: %v", <-errs)
		}
		if got := started.Load(); got > defaultExecStreams {
			t.Errorf("%d commands of one box were relayed at once, want at most %d", got, defaultExecStreams)
		}
		// One agent socket per relayed command, and a few more.
		if got := socks; got > defaultExecStreams+64 {
			t.Errorf("daemon holds %d Unix sockets during the flood, want at most %d", got, defaultExecStreams+64)
		}
		neighbourWorks(t, neighbour)
		cancel()
		wg.Wait()
	})

	t.Run("code runs and session commands", func(t *testing.T) {
		// Relayed by internal/codeexec rather than the exec handlers, and
		// counted against the same bound: 160 code runs and 160 commands
		// queued behind each other in one shell, all held open.
		const n = 320
		fctx, cancel := context.WithCancel(ctx)
		defer cancel()
		c := d.client()
		defer c.Close()
		sb := c.Sandbox(attacker.ID)
		sess, err := sb.CreateSession(ctx, sbx.SessionOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close(context.Background())
		var refused atomic.Int32
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if i%2 == 0 {
					_, err = sb.RunCode(fctx, "bash", "sleep 600", sbx.RunCodeOptions{})
				} else {
					_, err = sess.Exec(fctx, "sleep 600", sbx.SessionExecOptions{})
				}
				switch {
				case fctx.Err() != nil:
				case sdkCode(err) == connect.CodeResourceExhausted && strings.Contains(err.Error(), "--exec-max-streams"):
					refused.Add(1)
				default:
					errs <- fmt.Errorf("run code or session exec: %v", err)
				}
			}()
		}
		want := int32(n - defaultExecStreams)
		waitUntil(t, 120*time.Second, func() bool { return refused.Load() >= want || len(errs) > 0 },
			func() string { return fmt.Sprintf("%d of %d refused, want %d", refused.Load(), n, want) })
		t.Logf("code runs and session commands: %d refused of %d; daemon Unix sockets %d, RSS %d MiB", refused.Load(), n, unixSockets(t, pid), vmRSS(t, pid))
		if len(errs) > 0 {
			t.Fatalf("a flooding call failed other than with ResourceExhausted naming --exec-max-streams: %v", <-errs)
		}
		neighbourWorks(t, neighbour)
		cancel()
		wg.Wait()
	})

	// The flood's streams are released: the box itself works again.
	waitUntil(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		res, err := attacker.Run(ctx, "true")
		return err == nil && res.Code == 0
	}, func() string { return "the flooded box does not run commands after the flood" })
}

// neighbourWorks runs commands and a file round trip in sb, each within a
// bounded wait.
func neighbourWorks(t *testing.T, sb *sbx.Sandbox) {
	t.Helper()
	execWorks(t, sb, "neighbour during the flood")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	data := bytes.Repeat([]byte("neighbour "), 100_000)
	if err := sb.WriteFile(ctx, "/tmp/n.txt", data, 0); err != nil {
		t.Fatalf("neighbour's write during the flood: %v", err)
	}
	got, err := sb.ReadFile(ctx, "/tmp/n.txt")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("neighbour's read during the flood: %d bytes, %v; want the %d written", len(got), err, len(data))
	}
}

// slowReader is an HTTP/2 client that takes 64 KiB per stream before
// its reader must catch up: the test's own memory stays small however much
// the daemon would send.
func slowReader() *http.Client {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols:   &protos,
		DialContext: (&net.Dialer{}).DialContext,
		HTTP2:       &http.HTTP2Config{MaxReceiveBufferPerStream: 64 << 10, MaxReceiveBufferPerConnection: 64 << 20},
	}
	return &http.Client{Transport: tr}
}

// sdkCode is the code of an error from the SDK (none: Unknown).
func sdkCode(err error) connect.Code {
	if se := (*sbx.Error)(nil); errors.As(err, &se) {
		return se.Code
	}
	return connect.CodeOf(err)
}

// firstByte calls f at the first write.
type firstByte struct {
	once sync.Once
	f    func()
}

func (w *firstByte) Write(p []byte) (int, error) {
	w.once.Do(w.f)
	return len(p), nil
}

// waitUntil polls cond until it holds or timeout passes (then fails with what()).
func waitUntil(t *testing.T, timeout time.Duration, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settledRSS waits until pid's resident memory stops growing (less than
// 4 MiB in a second) or passes limit, and returns it in MiB.
func settledRSS(t *testing.T, pid, limit int) int {
	t.Helper()
	prev, rss := -1, vmRSS(t, pid)
	waitUntil(t, 60*time.Second, func() bool {
		if rss > limit || prev >= 0 && rss-prev < 4 {
			return true
		}
		time.Sleep(time.Second)
		prev, rss = rss, vmRSS(t, pid)
		return false
	}, func() string { return fmt.Sprintf("daemon RSS still growing: %d MiB", rss) })
	return rss
}

// vmRSS is pid's resident memory in MiB.
func vmRSS(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb >> 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// unixSockets counts pid's descriptors that are Unix sockets.
func unixSockets(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(l); len(f) >= 7 {
			inodes[f[6]] = true
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
			n++
		}
	}
	return n
}
