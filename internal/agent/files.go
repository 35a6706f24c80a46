package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"connectrpc.com/connect"
)

// fileChunkSize is the size of the FileChunk messages ReadFile and
// DownloadTar stream: large enough that per-message costs (framing, a
// syscall or two per hop) vanish beside the copying, small enough that
// what the daemon holds of a stream whose client stalled (a flow-control
// window and the message being relayed) stays near 2 MiB.
const fileChunkSize = 256 << 10

var (
	// errAgentProc refuses the agent's own /proc entries (see boxFS).
	errAgentProc = errors.New("the agent's own /proc entries are not served by the file API")
	// errProcElsewhere refuses procfs reached other than through /proc.
	errProcElsewhere = errors.New("procfs outside /proc is not served by the file API")
)

// fsError converts a file system error into a connect error naming path.
func fsError(op, path string, err error) error {
	if err == nil {
		return nil
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return connect.NewError(ce.Code(), fmt.Errorf("%s %s: %s", op, path, ce.Message()))
	}
	code := connect.CodeInternal
	var errno syscall.Errno
	switch {
	// Specific errnos first: ENOTEMPTY, for one, also matches fs.ErrExist.
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EXDEV),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EBUSY):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS),
		errors.Is(err, errAgentProc), errors.Is(err, errProcElsewhere):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENAMETOOLONG):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = connect.CodeResourceExhausted
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	// The message names path already; drop the path of the os error itself.
	msg := err.Error()
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe) && pe == err:
		msg = pe.Err.Error()
	case errors.As(err, &le) && le == err:
		msg = le.Err.Error()
	case errors.As(err, &errno) && errno == err:
		msg = errno.Error()
	}
	return connect.NewError(code, fmt.Errorf("%s %s: %s", op, path, msg))
}
