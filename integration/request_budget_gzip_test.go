package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestRequestBytesBudgetCompressed: the request-bytes budget must count
// what a compressed message expands to, not the compressed bytes. Each of
// 10 WriteFile calls sends, gzip-compressed, a 60 MiB data message (700 KB
// of random bytes, then zeros: within the API's 100x expansion bound) to a
// FIFO in the box that no one reads, and keeps its stream open, so the
// daemon keeps the message. The budget is 128 MiB a tenant: on the old
// code it charged about 0.75 MiB a call, admitted all 10 and the daemon
// grew by 1.8 GiB; now the calls past the two that fit are refused with
// ResourceExhausted naming --request-bytes-per-tenant (the daemon grew by
// 250 MiB).
func TestRequestBytesBudgetCompressed(t *testing.T) {
	d := startDaemon(t, "--request-bytes-per-tenant", "128M", "--request-bytes-total", "256M")
	ctx := ctxT(t, 3*time.Minute)
	sb, err := d.client().Create(ctx, sbx.CreateOptions{Command: []string{"sleep", "infinity"}})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	defer sb.Destroy(context.Background()) //nolint:errcheck
	if st, err := sb.Exec(ctx, sbx.ExecOptions{Argv: []string{"mkfifo", "/tmp/fifo"}}); err != nil || st.Code != 0 {
		t.Fatalf("mkfifo: %v %v", st, err)
	}

	envelope := func(flags byte, m []byte) []byte {
		return append(binary.BigEndian.AppendUint32([]byte{flags}, uint32(len(m))), m...)
	}
	var hdr, h []byte
	h = protowire.AppendTag(h, 1, protowire.BytesType)
	h = protowire.AppendString(h, sb.ID)
	h = protowire.AppendTag(h, 2, protowire.BytesType)
	h = protowire.AppendString(h, "/tmp/fifo")
	hdr = protowire.AppendTag(hdr, 1, protowire.BytesType)
	hdr = protowire.AppendBytes(hdr, h)
	const dataSize = 60 << 20
	data := make([]byte, dataSize)
	if _, err := rand.Read(data[:700<<10]); err != nil {
		t.Fatal(err)
	}
	var m []byte
	m = protowire.AppendTag(m, 2, protowire.BytesType)
	m = protowire.AppendBytes(m, data)
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	_, _ = zw.Write(m)
	_ = zw.Close()
	attack := append(envelope(0, hdr), envelope(1, z.Bytes())...)
	t.Logf("one call: a %d-byte data message, %d compressed", len(m), z.Len())

	pid := d.cmd.Process.Pid
	base := vmRSS(t, pid)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const n = 10
	answers := make(chan string, n)
	for range n {
		pr, pw := io.Pipe()
		defer pw.Close()
		go func() { _, _ = pw.Write(attack) }()
		go func() {
			req, err := http.NewRequestWithContext(cctx, http.MethodPost, "http://"+d.addr+"/sbx.v1.SandboxService/WriteFile", pr)
			if err != nil {
				answers <- err.Error()
				return
			}
			req.Header.Set("Content-Type", "application/connect+proto")
			req.Header.Set("Connect-Content-Encoding", "gzip")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if cctx.Err() == nil {
					answers <- err.Error()
				}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			pw.CloseWithError(io.ErrClosedPipe) // the writer gives up
			if cctx.Err() == nil {
				answers <- string(b)
			}
		}()
	}
	// An admitted call never ends (its FIFO has no reader); a refused one
	// ends at once. Two 60 MiB messages fit in 128 MiB (the budget charges
	// them at what they may expand to, 64 MiB each): wait for the other
	// eight refusals, or 20 s.
	const fits = 2
	refused := 0
	for deadline := time.After(20 * time.Second); refused < n-fits; {
		select {
		case a := <-answers:
			if !strings.Contains(a, "resource_exhausted") || !strings.Contains(a, "--request-bytes-per-tenant") {
				t.Fatalf("a call ended: got %q, want resource_exhausted naming --request-bytes-per-tenant", a)
			}
			refused++
			continue
		case <-deadline:
		}
		break
	}
	t.Logf("%d of %d calls refused; the daemon grew by %d MiB", refused, n, vmRSS(t, pid)-base)
	if refused < n-fits {
		t.Errorf("%d of %d compressed 60 MiB messages refused under a 128 MiB budget, want %d", refused, n, n-fits)
	}
}
