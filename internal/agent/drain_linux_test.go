package agent

import (
	"bytes"
	"errors"
	"os"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// TestReadOrDrainKeepsBufferedOutput: output a process wrote before it
// exited is read even when its reader first runs after the drain deadline
// (the poller refused that read before: an exec of `echo 42` could exit 0
// with empty stdout under load), and nothing more is waited for.
func TestReadOrDrainKeepsBufferedOutput(t *testing.T) {
	tests := []struct {
		name  string
		write []byte
	}{
		{"small", []byte("42\n")},
		{"several chunks", bytes.Repeat([]byte("x"), 2*chunkSize-100)},
		{"nothing", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			defer w.Close() // held open, as by a background grandchild
			if len(tt.write) > 0 {
				if _, err := w.Write(tt.write); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.SetReadDeadline(pastDeadline); err != nil {
				t.Fatal(err)
			}
			var got []byte
			buf := make([]byte, chunkSize)
			drained := 0
			for {
				n, err := readOrDrain(r, buf, &drained)
				got = append(got, buf[:n]...)
				if err != nil {
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("read ended with %v, want the deadline", err)
					}
					break
				}
			}
			if !bytes.Equal(got, tt.write) {
				t.Errorf("got %d bytes, want the %d written", len(got), len(tt.write))
			}
		})
	}
}

// TestReadOrDrainBounded: past the deadline a writer that never stops (a
// grandchild holding the pipe) is read for at most drainMax bytes.
func TestReadOrDrainBounded(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		chunk := bytes.Repeat([]byte("y"), 4096)
		for {
			select {
			case <-stop:
				w.Close()
				return
			default:
			}
			w.Write(chunk)
		}
	}()
	defer func() { close(stop); r.Close(); <-done }()
	if err := r.SetReadDeadline(pastDeadline); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, chunkSize)
	drained, total := 0, 0
	for {
		n, err := readOrDrain(r, buf, &drained)
		total += n
		if err != nil {
			break
		}
	}
	if total > drainMax+chunkSize {
		t.Errorf("read %d bytes past the deadline, want at most %d", total, drainMax+chunkSize)
	}
}

// TestProcessReadAfterDeadline: process.read forwards what an exited
// process left in its pipe although its drain deadline passed before the
// read began.
func TestProcessReadAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	w.Write([]byte("42\n"))
	p := &process{stdout: r}
	p.drainSoon()
	if err := r.SetReadDeadline(pastDeadline); err != nil {
		t.Fatal(err)
	}
	out := make(chan *sbxv1.ExecOutput, 4)
	p.read(r, false, out, make(chan struct{}))
	var got []byte
	for m := range out {
		if m == nil {
			break
		}
		got = append(got, m.GetStdout()...)
	}
	if string(got) != "42\n" {
		t.Errorf("got stdout %q, want %q", got, "42\n")
	}
}
