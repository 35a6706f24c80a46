package network

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// errIdle ends a passed-through connection on which neither side has sent
// anything for the proxy's idle timeout (Limits.EgressIdleTimeout): a box
// must not keep daemon descriptors forever by opening connections and
// leaving them.
var errIdle = errors.New("idle for too long")

// idleWatch is the last activity of a connection pair, both directions.
type idleWatch struct {
	timeout time.Duration
	last    atomic.Int64 // unix nanoseconds
}

func newIdleWatch(timeout time.Duration) *idleWatch {
	w := &idleWatch{timeout: timeout}
	w.touch()
	return w
}

func (w *idleWatch) touch() { w.last.Store(time.Now().UnixNano()) }

func (w *idleWatch) idleFor() time.Duration { return time.Since(time.Unix(0, w.last.Load())) }

// copy copies r (read from the connection rc, whose read deadline it sets)
// to dst until the end of r (nil) or an error. A read that waits the idle
// timeout ends it with errIdle unless the other direction was active
// meanwhile; a write blocked that long fails.
func (w *idleWatch) copy(dst net.Conn, r io.Reader, rc net.Conn) error {
	buf := make([]byte, 32<<10)
	for {
		_ = rc.SetReadDeadline(time.Now().Add(w.timeout))
		n, err := r.Read(buf)
		if n > 0 {
			w.touch()
			_ = dst.SetWriteDeadline(time.Now().Add(w.timeout))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
			w.touch()
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if w.idleFor() < w.timeout {
				continue // the other direction is busy
			}
			return errIdle
		default:
			return err
		}
	}
}
