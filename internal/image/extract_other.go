//go:build !linux

package image

import (
	"errors"
	"os"
	"time"
)

var errNeedsLinux = errors.New("overlayfs layers can only be unpacked on Linux")

func mkWhiteout(*os.Root, string, string, int) error { return errNeedsLinux }

func setOpaque(*os.Root, string) error { return errNeedsLinux }

func setFileTimes(*os.File, time.Time, time.Time) error { return nil }

func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(dir+"/lock", os.O_RDWR|os.O_CREATE, 0o600)
}
