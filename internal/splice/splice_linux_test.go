package splice

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// pair returns two connected sockets of network ("tcp" or "unix").
func pair(t *testing.T, network string) (net.Conn, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	a, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestCopy moves bytes between every kind of descriptor the daemon and the
// agent splice between, and through the read/write fallback, and checks
// them byte for byte (a prefix included), and that no pipe is left open.
func TestCopy(t *testing.T) {
	data := make([]byte, 5<<20+123)
	rand.Read(data)
	for _, tc := range []struct {
		name     string
		pipeSize int
		prefix   int
		// run sends data through Copy from one descriptor kind to another
		// and returns what arrived.
		run func(t *testing.T, src []byte, copyFn func(dst io.Writer, src io.Reader) (int64, error)) []byte
	}{
		{name: "tcp to unix", pipeSize: 1 << 20, run: socketToSocket("tcp", "unix")},
		{name: "unix to tcp", run: socketToSocket("unix", "tcp")},
		{name: "unix to tcp with a prefix", prefix: 1000, run: socketToSocket("unix", "tcp")},
		{name: "file to unix", pipeSize: 1 << 20, run: fileToSocket},
		{name: "unix to file", run: socketToFile},
		{name: "unix to pipe", run: socketToPipe},
		{name: "buffer to unix (fallback)", run: bufferToSocket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			// In a subtest of its own, so that its sockets are closed
			// (t.Cleanup) before the descriptors are counted again.
			t.Run("copy", func(t *testing.T) { checkCopy(t, tc.run, tc.prefix, tc.pipeSize, data) })
			if after := openFDs(t); after > before {
				t.Errorf("open descriptors: got %d after, want at most %d (before)", after, before)
			}
		})
	}
}

// checkCopy runs one transfer through Copy (after reading prefix bytes
// ahead, when set) and checks what arrived.
func checkCopy(t *testing.T, run func(*testing.T, []byte, func(io.Writer, io.Reader) (int64, error)) []byte, prefix, pipeSize int, data []byte) {
	got := run(t, data, func(dst io.Writer, src io.Reader) (int64, error) {
		if prefix > 0 {
			// The first bytes already read (as from a bufio.Reader).
			p := make([]byte, prefix)
			if _, err := io.ReadFull(src, p); err != nil {
				return 0, err
			}
			src = &Prefixed{P: p, R: src}
		}
		return Copy(dst, src, int64(len(data)), pipeSize)
	})
	if !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes, want the %d sent, byte for byte", len(got), len(data))
	}
}

// socketToSocket feeds data into a from-socket and copies it to a
// to-socket.
func socketToSocket(from, to string) func(t *testing.T, data []byte, copyFn func(io.Writer, io.Reader) (int64, error)) []byte {
	return func(t *testing.T, data []byte, copyFn func(io.Writer, io.Reader) (int64, error)) []byte {
		inW, inR := pair(t, from)
		outW, outR := pair(t, to)
		go func() { inW.Write(data) }()
		got := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(outR); got <- b }()
		n, err := copyFn(outW, inR)
		if err != nil || n != int64(len(data)) {
			t.Fatalf("Copy: got %d, %v; want %d, nil", n, err, len(data))
		}
		outW.Close()
		return <-got
	}
}

func fileToSocket(t *testing.T, data []byte, copyFn func(io.Writer, io.Reader) (int64, error)) []byte {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, r := pair(t, "unix")
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(r); got <- b }()
	if n, err := copyFn(w, f); err != nil || n != int64(len(data)) {
		t.Fatalf("Copy: got %d, %v; want %d, nil", n, err, len(data))
	}
	w.Close()
	return <-got
}

func socketToFile(t *testing.T, data []byte, copyFn func(io.Writer, io.Reader) (int64, error)) []byte {
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, r := pair(t, "unix")
	go func() { w.Write(data) }()
	if n, err := copyFn(f, r); err != nil || n != int64(len(data)) {
		t.Fatalf("Copy: got %d, %v; want %d, nil", n, err, len(data))
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func socketToPipe(t *testing.T, data []byte, copyFn func(io.Writer, io.Reader) (int64, error)) []byte {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	w, r := pair(t, "unix")
	go func() { w.Write(data) }()
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(pr); got <- b }()
	if n, err := copyFn(pw, r); err != nil || n != int64(len(data)) {
		t.Fatalf("Copy: got %d, %v; want %d, nil", n, err, len(data))
	}
	pw.Close()
	return <-got
}

func bufferToSocket(t *testing.T, data []byte, copyFn func(io.Writer, io.Reader) (int64, error)) []byte {
	w, r := pair(t, "unix")
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(r); got <- b }()
	if n, err := copyFn(w, bytes.NewReader(data)); err != nil || n != int64(len(data)) {
		t.Fatalf("Copy: got %d, %v; want %d, nil", n, err, len(data))
	}
	w.Close()
	return <-got
}

// TestCopyErrors checks that a source that ends early and a destination
// that goes away are told apart (ErrSource, ErrDestination), spliced and
// not.
func TestCopyErrors(t *testing.T) {
	t.Run("short socket source", func(t *testing.T) {
		inW, inR := pair(t, "unix")
		outW, outR := pair(t, "tcp")
		go io.Copy(io.Discard, outR)
		go func() { inW.Write(make([]byte, 1000)); inW.Close() }()
		n, err := Copy(outW, inR, 1<<20, 0)
		if !errors.Is(err, ErrSource) || !errors.Is(err, io.ErrUnexpectedEOF) || n != 1000 {
			t.Errorf("got %d, %v; want 1000 and ErrSource wrapping io.ErrUnexpectedEOF", n, err)
		}
	})
	t.Run("short buffer source", func(t *testing.T) {
		outW, outR := pair(t, "unix")
		go io.Copy(io.Discard, outR)
		_, err := Copy(outW, bytes.NewReader(make([]byte, 10)), 100, 0)
		if !errors.Is(err, ErrSource) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("got %v, want ErrSource wrapping io.ErrUnexpectedEOF", err)
		}
	})
	t.Run("destination gone", func(t *testing.T) {
		inW, inR := pair(t, "unix")
		outW, outR := pair(t, "unix")
		outR.Close()
		go func() { inW.Write(make([]byte, 4<<20)) }()
		_, err := Copy(outW, inR, 4<<20, 0)
		if !errors.Is(err, ErrDestination) || errors.Is(err, ErrSource) {
			t.Errorf("got %v, want ErrDestination only", err)
		}
	})
}
