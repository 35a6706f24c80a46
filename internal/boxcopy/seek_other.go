//go:build !linux

package boxcopy

import "os"

func nextData(_ *os.File, off, size int64) (int64, int64, error) { return off, size, nil }
