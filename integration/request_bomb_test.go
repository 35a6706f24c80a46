package integration

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestRequestBombs: the daemon reads a request message whole, unknown
// fields and all, and a streaming call keeps it until it ends; every
// procedure took 64 MiB messages, and gzip-compressed ones expanded
// without bound. 40 Events streams whose requests carried 60 MiB of zeros
// in an unknown field, 61 KB each once compressed, made the daemon hold
// 5.3 GiB while they stayed open. Now procedures that carry no bulk data
// take 4 MiB messages, and a compressed message may expand at most 100
// times: both bombs (an Events call, and an Exec, whose stdin may be 64
// MiB) are refused at once and the daemon's memory stays put.
func TestRequestBombs(t *testing.T) {
	d := startDaemon(t)
	pid := d.cmd.Process.Pid
	base := vmRSS(t, pid)

	// A Connect streaming request: one gzip-compressed message holding
	// 60 MiB of zeros in field 1000, unknown to every request type.
	var msg []byte
	msg = protowire.AppendTag(msg, 1000, protowire.BytesType)
	msg = protowire.AppendBytes(msg, make([]byte, 60<<20))
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	_, _ = zw.Write(msg)
	_ = zw.Close()
	body := binary.BigEndian.AppendUint32([]byte{1}, uint32(z.Len()))
	body = append(body, z.Bytes()...)
	t.Logf("each request: %d bytes", len(body))

	for _, proc := range []string{"/sbx.v1.ObserveService/Events", "/sbx.v1.SandboxService/Exec"} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var answers []string
		var held []io.Closer
		for range 40 {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodPost, "http://"+d.addr+proc, bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				req.Header.Set("Content-Type", "application/connect+proto")
				req.Header.Set("Connect-Content-Encoding", "gzip")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				// Read what comes within a few seconds: a refusal ends the
				// stream; an accepted Events stream stays open (and is held).
				done := make(chan []byte, 1)
				go func() { b, _ := io.ReadAll(resp.Body); done <- b }()
				var got string
				select {
				case b := <-done:
					got = string(b)
				case <-time.After(5 * time.Second):
					got = "(still open)"
				}
				mu.Lock()
				answers = append(answers, got)
				held = append(held, resp.Body)
				mu.Unlock()
			})
		}
		wg.Wait()
		rss := vmRSS(t, pid)
		t.Logf("%s: daemon RSS %d MiB (from %d)", proc, rss, base)
		for _, a := range answers {
			if !strings.Contains(a, "resource_exhausted") {
				t.Errorf("%s with a 60 MiB message compressed to %d bytes: got %q, want resource_exhausted", proc, len(body), a)
				break
			}
		}
		if rss-base > 1024 {
			t.Errorf("%s: daemon RSS grew by %d MiB for 40 requests of %d bytes, want at most 1024", proc, rss-base, len(body))
		}
		for _, c := range held {
			_ = c.Close()
		}
	}
}
