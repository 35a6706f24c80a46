package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestE2BEnvdRequestBounds: envd's Connect services (process, filesystem),
// reached through the E2B routing headers, bound a request message as the
// API does (4 MiB, a gzipped one too) and count it against the request-bytes
// budget. Each of 4 process.Process/Start calls sends 1 MiB of gzip that
// expands to 1 GiB of zeros; on the old code the daemon took each in whole
// (no bound on a message, none on gzip's expansion, no budget) and grew by
// GiBs; now each is refused with resource_exhausted and the daemon stays
// within 200 MiB of where it was.
func TestE2BEnvdRequestBounds(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 3*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"sleep", "infinity"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	defer sb.Destroy(context.Background()) //nolint:errcheck

	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	zero := make([]byte, 1<<20)
	for range 1024 {
		_, _ = zw.Write(zero)
	}
	_ = zw.Close()
	body := append(binary.BigEndian.AppendUint32([]byte{1}, uint32(z.Len())), z.Bytes()...)
	t.Logf("one call: 1 GiB of zeros, %d bytes gzipped", z.Len())

	pid := d.cmd.Process.Pid
	base := vmRSS(t, pid)
	const n = 4
	answers := make(chan string, n)
	for range n {
		go func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.addr+"/process.Process/Start", bytes.NewReader(body))
			if err != nil {
				answers <- err.Error()
				return
			}
			req.Header.Set("Content-Type", "application/connect+proto")
			req.Header.Set("Connect-Content-Encoding", "gzip")
			req.Header.Set("E2b-Sandbox-Id", sb.ID)
			req.Header.Set("E2b-Sandbox-Port", "49983")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers <- endStream(b)
		}()
	}
	peak := 0
	for range n {
		a := <-answers
		peak = max(peak, vmRSS(t, pid)-base)
		if !strings.Contains(a, "resource_exhausted") {
			t.Errorf("a 1 GiB gzipped envd message: got %q, want resource_exhausted", a)
		}
	}
	t.Logf("the daemon grew by %d MiB at most", peak)
	if peak > 200 {
		t.Errorf("the daemon grew by %d MiB taking gzipped envd messages, want at most 200", peak)
	}
}

// endStream returns the payload of the first Connect envelope in b,
// gunzipped when its flag says so (the daemon compresses its answer as the
// request was); b itself when it holds no envelope.
func endStream(b []byte) string {
	if len(b) < 5 || int(binary.BigEndian.Uint32(b[1:5])) > len(b)-5 {
		return string(b)
	}
	p := b[5 : 5+binary.BigEndian.Uint32(b[1:5])]
	if b[0]&1 == 0 {
		return string(p)
	}
	zr, err := gzip.NewReader(bytes.NewReader(p))
	if err != nil {
		return string(b)
	}
	out, _ := io.ReadAll(zr)
	return string(out)
}
