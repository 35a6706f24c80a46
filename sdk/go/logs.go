package sbx

import (
	"context"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// LogsOptions select what Logs reads of the sandbox's own command (the
// create's Command, else its image's ENTRYPOINT/CMD).
type LogsOptions struct {
	// Follow keeps reading new output until the command exits.
	Follow bool
	// Since skips output that arrived before it (zero: all).
	Since time.Time
	// Tail, if not nil, keeps only the last *Tail lines of what is
	// buffered (0: none, e.g. to follow only new output).
	Tail *uint32
	// Stdout and Stderr receive the output (nil: discarded).
	Stdout, Stderr io.Writer
}

// LogsResult is what a Logs call saw.
type LogsResult struct {
	// DroppedStdout and DroppedStderr count the bytes of each stream the
	// sandbox dropped before they were read: it keeps only the newest
	// 1 MiB of each.
	DroppedStdout, DroppedStderr uint64
	// Exit is how the command ended, if it has (nil while it runs).
	Exit *ExitStatus
}

// Logs writes the output of the sandbox's own command to opts.Stdout and
// opts.Stderr; with Follow it returns once the command has exited (or ctx
// ends). Any number of readers may follow at once; one that stops does not
// affect the command.
func (s *Sandbox) Logs(ctx context.Context, opts LogsOptions) (*LogsResult, error) {
	req := &sbxv1.LogsRequest{Sandbox: s.ID, Follow: opts.Follow, Tail: opts.Tail}
	if !opts.Since.IsZero() {
		req.SinceUnixMs = opts.Since.UnixMilli()
	}
	st, err := s.c.api.Logs(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrap("logs of "+s.ID, err)
	}
	defer st.Close()
	res := &LogsResult{}
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.LogsEvent_Data:
			w := opts.Stdout
			if ev.Data.GetStderr() {
				w = opts.Stderr
			}
			if w != nil {
				if _, err := w.Write(ev.Data.GetData()); err != nil {
					return res, fmt.Errorf("writing logs of %s: %w", s.ID, err)
				}
			}
		case *sbxv1.LogsEvent_Dropped:
			res.DroppedStdout += ev.Dropped.GetStdoutBytes()
			res.DroppedStderr += ev.Dropped.GetStderrBytes()
		case *sbxv1.LogsEvent_Exited:
			res.Exit = exitStatusOf(ev.Exited)
		}
	}
	if err := st.Err(); err != nil {
		return res, wrap("logs of "+s.ID, err)
	}
	return res, nil
}

// Wait returns once the sandbox's own command has exited, with how it
// ended; the status is kept for the sandbox's life, so any number of calls
// get it. A sandbox without a command is an error (FailedPrecondition).
func (s *Sandbox) Wait(ctx context.Context) (*ExitStatus, error) {
	resp, err := s.c.api.Wait(ctx, connect.NewRequest(&sbxv1.WaitRequest{Sandbox: s.ID}))
	if err != nil {
		return nil, wrap("wait for "+s.ID, err)
	}
	return exitStatusOf(resp.Msg.GetExited()), nil
}

func exitStatusOf(x *sbxv1.ExecExited) *ExitStatus {
	return &ExitStatus{
		Code: int(x.GetExitCode()), Signal: int(x.GetSignal()), TimedOut: x.GetTimedOut(), OOMKilled: x.GetOomKilled(),
		PidsLimitHit: x.GetPidsLimitHit(),
		Error:        x.GetError(), Duration: time.Duration(x.GetDurationMs()) * time.Millisecond,
	}
}
