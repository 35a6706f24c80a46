package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/execframe"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
)

// rawCountingDriver is the fake driver whose agent connections count those
// that start a raw file transfer.
type rawCountingDriver struct {
	runtime.Driver
	raw atomic.Int64
}

func (d *rawCountingDriver) Dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	c, err := d.Driver.Dial(ctx, h)
	if err != nil {
		return nil, err
	}
	return &rawFirstByteConn{Conn: c, raw: &d.raw}, nil
}

type rawFirstByteConn struct {
	net.Conn
	once sync.Once
	raw  *atomic.Int64
}

func (c *rawFirstByteConn) Write(p []byte) (int, error) {
	if len(p) > 0 {
		c.once.Do(func() {
			if p[0] == execframe.FrameFileWrite || p[0] == execframe.FrameFileRead {
				c.raw.Add(1)
			}
		})
	}
	return c.Conn.Write(p)
}

// TestRawFilesAgentProtocols: the raw file route works with an agent of
// protocol 6 over raw file connections, and with one the daemon speaks
// protocol 5 to (an older agent) over the WriteFile and ReadFile streams,
// which it then relays from and to the same route: the client sees the
// same bytes and the same errors either way.
func TestRawFilesAgentProtocols(t *testing.T) {
	ctx := context.Background()
	data := make([]byte, 3<<20+5)
	rand.Read(data)
	for _, tc := range []struct {
		name     string
		protocol uint32
		wantRaw  bool
	}{
		{"protocol 6", 0, true},
		{"protocol 5 (older agent)", 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var drv *rawCountingDriver
			e := newExecEnvConfig(t, nil, func(d *fake.Driver) runtime.Driver {
				drv = &rawCountingDriver{Driver: d}
				return drv
			}, tc.protocol)
			_, sb := e.client(t)
			p := filepath.Join(t.TempDir(), "f")
			if n, err := sb.Upload(ctx, p, bytes.NewReader(data), 0o600); err != nil || n != int64(len(data)) {
				t.Fatalf("Upload: %d, %v; want %d", n, err, len(data))
			}
			var got bytes.Buffer
			if err := sb.Download(ctx, p, &got); err != nil || !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("Download: %d bytes, %v; want the %d uploaded", got.Len(), err, len(data))
			}
			err := sb.Download(ctx, p+".missing", &got)
			if code := connect.CodeOf(err); code != connect.CodeNotFound {
				t.Errorf("Download of a missing file: got %v (%v), want NotFound", code, err)
			}
			_, err = sb.Upload(ctx, filepath.Join(p, "under-a-file"), bytes.NewReader(data), 0)
			if code := connect.CodeOf(err); code != connect.CodeFailedPrecondition && code != connect.CodeNotFound {
				t.Errorf("Upload below a file: got %v (%v), want FailedPrecondition or NotFound", code, err)
			}
			if raw := drv.raw.Load(); (raw > 0) != tc.wantRaw {
				t.Errorf("raw file connections to the agent: %d, want some: %v", raw, tc.wantRaw)
			}
		})
	}
}
