package agentconn

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/sbxdev/sbx/api/execframe"
	"github.com/sbxdev/sbx/api/gen/agent/v1/agentv1connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// TestOldAgentGetsNoRawFiles: an agent whose Hello says a protocol before
// 6 is never sent a raw file connection (it would take the frame for an
// HTTP/2 preface gone wrong): WriteFileRaw and ReadFileRaw answer
// errors.ErrUnsupported, having read nothing of the data, so the daemon
// falls back to the WriteFile and ReadFile RPCs.
func TestOldAgentGetsNoRawFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	_, h := agentv1connect.NewAgentServiceHandler(oldAgent{})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &protos}
	go srv.Serve(ln) //nolint:errcheck
	defer srv.Close()
	var raw atomic.Int32
	c := New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		return &rawFirstByte{Conn: nc, raw: &raw}, nil
	})
	defer c.Close()
	ctx := context.Background()
	src := bytes.NewReader(make([]byte, 1<<20))
	if _, taken, err := c.WriteFileRaw(ctx, &sbxv1.WriteFileHeader{Path: "/f"}, 1<<20, src, nil); !errors.Is(err, errors.ErrUnsupported) || taken != 0 || src.Len() != 1<<20 {
		t.Errorf("WriteFileRaw: got %v, %d bytes taken (%d left); want errors.ErrUnsupported and none taken", err, taken, src.Len())
	}
	if _, err := c.ReadFileRaw(ctx, &sbxv1.ReadFileRequest{Path: "/f"}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("ReadFileRaw: got %v, want errors.ErrUnsupported", err)
	}
	if n := raw.Load(); n != 0 {
		t.Errorf("%d raw file connections to an agent of protocol 4, want 0", n)
	}
}

// rawFirstByte counts connections whose first byte starts a raw file
// transfer.
type rawFirstByte struct {
	net.Conn
	counted atomic.Bool
	raw     *atomic.Int32
}

func (c *rawFirstByte) Write(p []byte) (int, error) {
	if len(p) > 0 && !c.counted.Swap(true) && (p[0] == execframe.FrameFileWrite || p[0] == execframe.FrameFileRead) {
		c.raw.Add(1)
	}
	return c.Conn.Write(p)
}
