package splice

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Copy copies exactly n bytes from src to dst; fewer is
// io.ErrUnexpectedEOF. When both are descriptors (syscall.Conn: sockets,
// pipes, regular files) the bytes go through a pipe of Copy's own, grown
// to pipeSize if the kernel lets it (0: the default 64 KiB), with
// splice(2): neither side's pages are copied into this process. Otherwise
// (a TLS connection, a buffered reader) it copies with read and write.
// A *Prefixed src has its prefix written first. Sockets keep their deadlines: closing either side, or a deadline, ends
// the copy with that error. On an error, n counts the bytes taken from src
// (up to a pipe's worth of them may not have reached dst). dst must not be a file opened O_APPEND (splice
// refuses it with EINVAL once data is in the pipe).
func Copy(dst io.Writer, src io.Reader, n int64, pipeSize int) (int64, error) {
	if n <= 0 {
		return 0, nil
	}
	done, src, err := prefix(dst, src, n)
	if err != nil || done == n {
		return done, err
	}
	k, err := spliceN(dst, src, n-done, pipeSize)
	return done + k, err
}

func spliceN(dst io.Writer, src io.Reader, n int64, pipeSize int) (int64, error) {
	sc, ok1 := src.(syscall.Conn)
	dc, ok2 := dst.(syscall.Conn)
	if !ok1 || !ok2 {
		return copyN(dst, src, n)
	}
	srcRC, err := sc.SyscallConn()
	if err != nil {
		return copyN(dst, src, n)
	}
	dstRC, err := dc.SyscallConn()
	if err != nil {
		return copyN(dst, src, n)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, os.NewSyscallError("pipe2", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if pipeSize > 0 {
		_, _ = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, pipeSize) // best effort: the default works too
	}
	chunk, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
	if err != nil || chunk <= 0 {
		chunk = 64 << 10
	}
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	var written int64
	for written < n {
		// Fill the pipe from src. The pipe is empty here, so EAGAIN is
		// src's: wait for it to be readable.
		var k int
		var serr error
		rerr := srcRC.Read(func(fd uintptr) bool {
			for {
				var k64 int64
				k64, serr = unix.Splice(int(fd), nil, p[1], nil, int(min(n-written, int64(chunk))), flags)
				k = int(k64)
				if serr != unix.EINTR {
					break
				}
			}
			return serr != unix.EAGAIN
		})
		if rerr != nil {
			return written, fmt.Errorf("%w: %w", ErrSource, rerr)
		}
		if serr != nil {
			return written, fmt.Errorf("%w: %w", ErrSource, os.NewSyscallError("splice", serr))
		}
		if k == 0 {
			return written, fmt.Errorf("%w: got %d of %d bytes: %w", ErrSource, written, n, io.ErrUnexpectedEOF)
		}
		// Drain it into dst; EAGAIN is now dst's (the pipe holds data).
		for k > 0 {
			var m int
			var werr error
			rerr := dstRC.Write(func(fd uintptr) bool {
				for {
					var m64 int64
					m64, werr = unix.Splice(p[0], nil, int(fd), nil, k, flags)
					m = int(m64)
					if werr != unix.EINTR {
						break
					}
				}
				return werr != unix.EAGAIN
			})
			// Failing here, the pipe's k bytes were taken from src but
			// never reached dst: the count says what src lost.
			if rerr != nil {
				return written + int64(k), fmt.Errorf("%w: %w", ErrDestination, rerr)
			}
			if werr != nil {
				return written + int64(k), fmt.Errorf("%w: %w", ErrDestination, os.NewSyscallError("splice", werr))
			}
			if m == 0 {
				return written + int64(k), fmt.Errorf("%w: %w", ErrDestination, io.ErrShortWrite)
			}
			k -= m
			written += int64(m)
		}
	}
	return written, nil
}
