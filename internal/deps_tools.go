//go:build deps

// This file pins modules that packages are about to use, so go.mod stays
// stable while they are written. It is never built.
package internal

import (
	_ "github.com/creack/pty"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/opencontainers/runtime-spec/specs-go"
	_ "github.com/spf13/cobra"
	_ "golang.org/x/sys/unix"
	_ "modernc.org/sqlite"
)
