//go:build !linux

package boxcopy

import "os"

// NextData reports the whole rest as data where SEEK_DATA is unknown.
func NextData(_ *os.File, off, size int64) (int64, int64, error) { return off, size, nil }
