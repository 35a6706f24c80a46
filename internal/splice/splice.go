// Package splice moves a known number of bytes from one descriptor to
// another without copying them through user space: on Linux with splice(2)
// through a pipe of its own, the way the kernel moves a file's pages to a
// socket or a socket's buffers to a file. The daemon relays file data
// between a client's connection and a sandbox's agent with it, the agent
// between that connection and the file. A leaf: it imports only x/sys.
package splice

import (
	"errors"
	"fmt"
	"io"
)

// ErrSource and ErrDestination mark Copy's errors by the side that failed
// (errors.Is): a relay tells a client that left from a sandbox that did.
var (
	ErrSource      = errors.New("reading the source")
	ErrDestination = errors.New("writing the destination")
)

// copyN copies exactly n bytes from src to dst with read and write.
func copyN(dst io.Writer, src io.Reader, n int64) (int64, error) {
	k, err := io.CopyN(dst, sideReader{src}, n)
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: got %d of %d bytes: %w", ErrSource, k, n, io.ErrUnexpectedEOF)
	}
	if err != nil && !errors.Is(err, ErrSource) {
		err = fmt.Errorf("%w: %w", ErrDestination, err)
	}
	return k, err
}

// sideReader marks its reader's errors (but EOF) with ErrSource.
type sideReader struct{ r io.Reader }

func (s sideReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: %w", ErrSource, err)
	}
	return n, err
}

// Prefixed is a reader whose first bytes were already read into P (a
// buffered reader's): Copy writes those first and splices the rest from R.
type Prefixed struct {
	P []byte
	R io.Reader
}

func (p *Prefixed) Read(b []byte) (int, error) {
	if len(p.P) > 0 {
		n := copy(b, p.P)
		p.P = p.P[n:]
		return n, nil
	}
	return p.R.Read(b)
}

// prefix writes up to n bytes of src's prefix to dst, if src is a
// *Prefixed, and returns what to copy the rest from.
func prefix(dst io.Writer, src io.Reader, n int64) (int64, io.Reader, error) {
	p, ok := src.(*Prefixed)
	if !ok {
		return 0, src, nil
	}
	k := min(int64(len(p.P)), n)
	w, err := dst.Write(p.P[:k])
	p.P = p.P[w:]
	if err != nil {
		return int64(w), nil, fmt.Errorf("%w: %w", ErrDestination, err)
	}
	return int64(w), p.R, nil
}
