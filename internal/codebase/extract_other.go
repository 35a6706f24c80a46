//go:build !linux

package codebase

import (
	"context"
	"io"
	"log/slog"
)

type extractOpts struct {
	uid, gid     int
	maxBytes     int64
	maxEntries   int
	maxFileBytes int64
	skip         func(name string, size int64, reason string)
	log          *slog.Logger
}

type extractStats struct{ Files, Bytes int64 }

func extractTree(context.Context, io.Reader, string, extractOpts) (extractStats, error) {
	return extractStats{}, errNeedsLinux
}
