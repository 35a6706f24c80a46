package integration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sbxdev/sbx/internal/tenant"
)

// TestRequestBytesBudget: one tenant opens 16 BuildImage requests at once,
// each sending 40 MiB of a context and then stalling before the message's
// last KiB, so that the daemon holds what it has read for as long as the
// client likes. Before, the daemon read them all: 12 such requests grew it
// by 1.4 GiB before the builder's budget could refuse them. Now the bytes
// of requests being read are bounded per tenant (256 MiB by default): the
// requests past it are refused at once with ResourceExhausted naming the
// bound, the daemon's memory stays within a few hundred MiB, and another
// tenant's requests, a 40 MiB one included, still go through while the
// attack holds its share; the tenant gets its budget back when they end.
func TestRequestBytesBudget(t *testing.T) {
	keyA, keyB := tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q]}, {"name": "beta", "tokens": [%q]}]}`,
		tenant.HashToken(keyA), tenant.HashToken(keyB)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonOpts(t, daemonOpts{token: keyA}, "--tenants", tenants)
	pid := d.cmd.Process.Pid
	base := vmRSS(t, pid)
	const ctxSize = 40 << 20
	// BuildImageRequest{dockerfile: df, context: 40 MiB}, enveloped.
	message := func(df string) []byte {
		var m []byte
		m = protowire.AppendTag(m, 4, protowire.BytesType)
		m = protowire.AppendString(m, df)
		m = protowire.AppendTag(m, 5, protowire.BytesType)
		m = protowire.AppendBytes(m, bytes.Repeat([]byte{'x'}, ctxSize))
		return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m))), m...)
	}
	attack := message("FROM scratch\n")
	post := func(key string, body io.Reader) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, "http://"+d.addr+"/sbx.v1.ImageService/BuildImage", body)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/connect+proto")
		req.Header.Set("Authorization", "Bearer "+key)
		return http.DefaultClient.Do(req)
	}

	const n = 16
	type outcome struct {
		refused string // the daemon's answer, when it refused
		stalled bool   // all but the last KiB sent and read
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes []outcome
		writers  []*io.PipeWriter
	)
	for range n {
		pr, pw := io.Pipe()
		mu.Lock()
		writers = append(writers, pw)
		mu.Unlock()
		wg.Go(func() {
			wrote := make(chan error, 1)
			go func() {
				_, err := pw.Write(attack[:len(attack)-1024])
				wrote <- err
			}()
			answered := make(chan string, 1)
			go func() {
				resp, err := post(keyA, pr)
				if err != nil {
					answered <- "error: " + err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answered <- string(b)
			}()
			var o outcome
			select {
			case err := <-wrote:
				if err != nil {
					o.refused = <-answered
				} else {
					o.stalled = true
				}
			case a := <-answered:
				o.refused = a
				pw.CloseWithError(io.ErrClosedPipe)
			}
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		})
	}
	wg.Wait()
	defer func() {
		for _, w := range writers {
			w.CloseWithError(io.ErrClosedPipe)
		}
	}()
	rss := vmRSS(t, pid)
	stalled := 0
	for _, o := range outcomes {
		switch {
		case o.stalled:
			stalled++
		case !strings.Contains(o.refused, "resource_exhausted") || !strings.Contains(o.refused, "--request-bytes-per-tenant"):
			t.Errorf("a refused request: got %q, want resource_exhausted naming --request-bytes-per-tenant", o.refused)
		}
	}
	t.Logf("%d requests of %d MiB stalled before their last KiB: %d being read, %d refused; daemon RSS %d MiB (from %d)",
		n, ctxSize>>20, stalled, n-stalled, rss, base)
	if stalled > 6 {
		t.Errorf("%d stalled 40 MiB requests of one tenant being read at once, want at most 6 (256 MiB)", stalled)
	}
	if rss-base > 768 {
		t.Errorf("daemon RSS grew by %d MiB, want at most 768", rss-base)
	}

	// Meanwhile another tenant's calls go through: a small one, and a
	// 40 MiB build whose context is refused (no tar) once it has been read.
	req, _ := http.NewRequest(http.MethodPost, "http://"+d.addr+"/sbx.v1.SandboxService/ListSandboxes", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+keyB)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("beta's ListSandboxes during the attack: got %d %s, want 200", resp.StatusCode, b)
	}
	resp, err = post(keyB, bytes.NewReader(message("BOGUS instruction\n")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "invalid_argument") || !strings.Contains(string(b), "build context") {
		t.Errorf("beta's 40 MiB build during the attack: got %q, want invalid_argument naming its context (read whole, then refused: it is no tar)", b)
	}

	// The attack ends: acme's budget comes back.
	for _, w := range writers {
		w.CloseWithError(io.ErrClosedPipe)
	}
	waitUntil(t, 30*time.Second, func() bool {
		resp, err := post(keyA, bytes.NewReader(message("BOGUS instruction\n")))
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), "invalid_argument")
	}, func() string { return "acme's 40 MiB build after its stalled requests ended: still refused" })
}
