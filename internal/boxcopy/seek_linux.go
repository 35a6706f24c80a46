package boxcopy

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// NextData returns the next data segment [start, end) of f at or after off
// (start == size when only a hole is left), for writers of formats that
// record holes themselves (sparse tar entries). File systems without
// SEEK_DATA report the whole rest as data.
func NextData(f *os.File, off, size int64) (start, end int64, err error) {
	fd := int(f.Fd())
	start, err = unix.Seek(fd, off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return size, size, nil
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
		return off, size, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("find data in source: %w", err)
	}
	end, err = unix.Seek(fd, start, unix.SEEK_HOLE)
	if err != nil {
		return 0, 0, fmt.Errorf("find hole in source: %w", err)
	}
	return start, min(end, size), nil
}
