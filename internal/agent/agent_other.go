//go:build !linux

package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync/atomic"

	"connectrpc.com/connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// The agent runs only inside Linux sandboxes. These stubs keep
// `go build ./...` working on other systems. The file service (openat2) is
// Linux-only too: its methods answer Unimplemented here.

var errNotLinux = errors.New("sbx-agent runs only on Linux")

// Options is what cmd/sbx-agent parsed from its command line.
type Options struct {
	ListenFD int
	ReadyFD  int
	ExecFD   int
	Seccomp  bool
	NoFile   uint64
	// UserCgroupFDs are unused outside Linux.
	UserCgroupFDs []int
	Listen        string
	ExecListen    string
	TLSDir        string
	Entrypoint    []string
	Logger        *slog.Logger
}

// Run fails: the agent needs Linux.
func Run(context.Context, Options) error { return errNotLinux }

type reaper struct{}

type spawner struct{}

type detachedTable struct{}

type entryProc struct{ p *process }

type process struct{ exited atomic.Bool }

func newReaper(bool, *slog.Logger) *reaper { return &reaper{} }

// Exec is unimplemented outside Linux.
func (s *Server) Exec(context.Context, *connect.BidiStream[sbxv1.ExecInput, sbxv1.ExecOutput]) error {
	return connect.NewError(connect.CodeUnimplemented, errNotLinux)
}

type startError struct {
	code int32
	err  error
}

func (e *startError) Error() string { return e.err.Error() }

func (s *Server) startEntrypointLocked([]string, []string, string, *userInfo) error {
	return errNotLinux
}

// fileWriter writes file data from the user cgroups on Linux only.
type fileWriter struct{}

// FileWriterArg is argv[1] of the file-writer helper (Linux only).
const FileWriterArg = "sbx-file-writer"

// FileWriterHelper fails off Linux.
func FileWriterHelper() error { return errNotLinux }

// muxExec returns ln: framed execs are served on Linux only.
func (s *Server) muxExec(_ context.Context, ln net.Listener) net.Listener { return ln }
