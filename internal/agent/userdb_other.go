//go:build !linux

package agent

import "os"

func openUserDB(path string) (*os.File, error) { return os.Open(path) }
