package agent

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/connlimit"
)

// flakyListener fails with errs, one per Accept, then accepts.
type flakyListener struct {
	net.Listener
	errs []error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	c, _ := net.Pipe()
	return c, nil
}

func (l *flakyListener) Addr() net.Addr { return &net.UnixAddr{Name: "test", Net: "unix"} }

func TestPatientListenerOutlastsErrors(t *testing.T) {
	fl := &flakyListener{errs: []error{
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.ENFILE},
		&net.OpError{Op: "accept", Err: syscall.ECONNABORTED},
		errors.New("something else"),
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
	}}
	var waits []time.Duration
	l := &patientListener{Listener: fl, backoff: connlimit.Backoff{
		Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sleep: func(d time.Duration) { waits = append(waits, d) },
	}}
	c, err := l.Accept()
	if err != nil || c == nil {
		t.Fatalf("Accept = %v, %v; want a connection after the errors pass", c, err)
	}
	c.Close()
	if len(waits) != 12 || waits[0] != 5*time.Millisecond || waits[1] != 10*time.Millisecond || waits[11] != time.Second {
		t.Errorf("waits = %v, want 5 ms doubling to 1 s", waits)
	}
	fl.errs = []error{net.ErrClosed}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on a closed listener = %v, want net.ErrClosed", err)
	}
}
