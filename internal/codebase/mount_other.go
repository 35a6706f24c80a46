//go:build !linux

package codebase

import (
	"errors"
	"syscall"
)

var errNeedsLinux = errors.New("codebase mounts need Linux")

func mountLayer(string, string, int64, int) (string, error) { return "", errNeedsLinux }
func unmountLayer(string) error                             { return errNeedsLinux }
func removeUnmounted(string) error                          { return errNeedsLinux }
func isWhiteout(uint32, uint64) bool                        { return false }
func isOpaque(string) bool                                  { return false }
func mtimeNs(st *syscall.Stat_t) int64                      { return st.Mtimespec.Nano() }
func ctimeNs(st *syscall.Stat_t) int64                      { return st.Ctimespec.Nano() }
