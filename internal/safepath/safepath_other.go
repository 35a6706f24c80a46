//go:build !linux

package safepath

import (
	"errors"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

var errNeedsLinux = errors.New("safepath needs Linux (openat2)")

// Root is unavailable off Linux: sandboxes run only there.
type Root struct{}

// Entry is a directory entry with its attributes.
type Entry struct{ fs.DirEntry }

// Stat is nil: no Root ever lists anything off Linux.
func (Entry) Stat() *unix.Stat_t { return nil }

// Stat is nil off Linux.
func Stat(fs.FileInfo) *unix.Stat_t { return nil }

func OpenRoot(string) (*Root, error)                              { return nil, errNeedsLinux }
func (*Root) Name() string                                        { return "" }
func (*Root) Close() error                                        { return nil }
func (*Root) OpenRoot(string) (*Root, error)                      { return nil, errNeedsLinux }
func (*Root) OpenFile(string, int, fs.FileMode) (*os.File, error) { return nil, errNeedsLinux }
func (*Root) Open(string) (*os.File, error)                       { return nil, errNeedsLinux }
func (*Root) Lstat(string) (fs.FileInfo, error)                   { return nil, errNeedsLinux }
func (*Root) Readlink(string) (string, error)                     { return "", errNeedsLinux }
func (*Root) ReadDir(string) ([]Entry, error)                     { return nil, errNeedsLinux }
func (*Root) Walk(string, WalkFunc) error                         { return errNeedsLinux }
func (*Root) Mkdir(string, fs.FileMode) error                     { return errNeedsLinux }
func (*Root) Symlink(string, string) error                        { return errNeedsLinux }
func (*Root) Link(*Root, string, string) error                    { return errNeedsLinux }
func (*Root) Rename(string, string) error                         { return errNeedsLinux }
func (*Root) Remove(string) error                                 { return errNeedsLinux }
func (*Root) RemoveAll(string) error                              { return errNeedsLinux }
func (*Root) Lchown(string, int, int) error                       { return errNeedsLinux }
func (*Root) Chmod(string, fs.FileMode) error                     { return errNeedsLinux }
func (*Root) Chtimes(string, time.Time, time.Time) error          { return errNeedsLinux }
func (*Root) Getxattr(string, string) ([]byte, bool, error)       { return nil, false, errNeedsLinux }
