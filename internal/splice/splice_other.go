//go:build !linux

package splice

import "io"

// Copy copies exactly n bytes from src to dst; fewer is
// io.ErrUnexpectedEOF. pipeSize is ignored here (no splice).
func Copy(dst io.Writer, src io.Reader, n int64, pipeSize int) (int64, error) {
	done, src, err := prefix(dst, src, n)
	if err != nil || done == n {
		return done, err
	}
	k, err := copyN(dst, src, n-done)
	return done + k, err
}
