package codeexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/store"
)

// Sessions and contexts run as detached processes of the sandbox's agent
// (agent.v1 Attach), under their own id: the agent keeps them running when
// the daemon's stream ends, so a restarted daemon re-attaches to them. Their
// metadata is persisted in a ProcessStore.

// ProcessStore persists sessions and contexts across daemon restarts
// (store.Store).
type ProcessStore interface {
	PutProcess(ctx context.Context, r *store.ProcessRecord) error
	GetProcess(ctx context.Context, id string) (*store.ProcessRecord, error)
	DeleteProcess(ctx context.Context, id string) error
	ListProcesses(ctx context.Context, kind string) ([]*store.ProcessRecord, error)
}

// attachTimeout bounds how long the agent may take to confirm an attach.
const attachTimeout = 30 * time.Second

// procStream is a detached process's Attach stream, seen as the exec
// events sessions and kernels speak.
type procStream struct {
	st *connect.BidiStreamForClient[agentv1.AttachInput, agentv1.AttachOutput]
}

// Send sends a stdin, stdin_close, resize or signal event.
func (p *procStream) Send(in *sbxv1.ExecInput) error {
	return p.st.Send(&agentv1.AttachInput{Event: &agentv1.AttachInput_Input{Input: in}})
}

// Receive returns the next output, keepalive or exited event.
func (p *procStream) Receive() (*sbxv1.ExecOutput, error) {
	for {
		msg, err := p.st.Receive()
		if err != nil {
			return nil, err
		}
		if o := msg.GetOutput(); o != nil {
			return o, nil
		}
	}
}

// close ends the stream on the daemon's side; the process keeps running.
func (p *procStream) close() { _ = p.st.CloseResponse() }

// attach opens an Attach stream on sctx (which outlives ctx; cancel ends
// it) to detached process id, starting req first unless it is nil, and
// returns once the agent has confirmed. ctx bounds only the confirmation.
// A process that is gone wraps errdefs.ErrNotFound; a command that could
// not be started wraps errdefs.ErrFailedPrecondition.
func attach(ctx, sctx context.Context, cancel context.CancelFunc, conn *agentconn.Conn, id string, req *sbxv1.ExecRequest) (*procStream, error) {
	ok := false
	defer func() {
		if !ok {
			cancel()
		}
	}()
	st := conn.Attach(sctx)
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	t := time.AfterFunc(attachTimeout, cancel)
	defer t.Stop()
	if err := st.Send(&agentv1.AttachInput{Event: &agentv1.AttachInput_Start{Start: &agentv1.AttachStart{Id: id, Exec: req}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("attaching to %s: %w", id, err)
	}
	msg, err := st.Receive()
	if err != nil {
		_ = st.CloseResponse()
		switch connect.CodeOf(err) {
		case connect.CodeNotFound:
			return nil, fmt.Errorf("attaching to %s: %w", id, errors.Join(errdefs.ErrNotFound, err))
		case connect.CodeUnimplemented:
			return nil, fmt.Errorf("the sandbox's agent is too old to keep sessions and contexts (agent protocol 2 needed; recreate the sandbox): %w", errdefs.ErrFailedPrecondition)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("attaching to %s: %w", id, err)
	}
	if ex := msg.GetOutput().GetExited(); ex != nil {
		_ = st.CloseResponse()
		return nil, fmt.Errorf("%s (exit code %d): %w", ex.GetError(), ex.GetExitCode(), errdefs.ErrFailedPrecondition)
	}
	if msg.GetAttached() == nil {
		_ = st.CloseResponse()
		return nil, fmt.Errorf("attaching to %s: the agent sent %T before attached: %w", id, msg.GetEvent(), errdefs.ErrUnavailable)
	}
	ok = true
	return &procStream{st: st}, nil
}

// checkDetached fails unless detached process id runs in conn's agent: a
// missing one wraps errdefs.ErrNotFound; one that exited is collected (its
// status is only logged by the caller) and wraps errdefs.ErrNotFound too.
func checkDetached(ctx context.Context, conn *agentconn.Conn, id string) error {
	resp, err := conn.ListDetached(ctx, connect.NewRequest(&agentv1.ListDetachedRequest{}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeUnimplemented {
			return fmt.Errorf("the sandbox's agent has no detached processes: %w", errdefs.ErrNotFound)
		}
		return fmt.Errorf("listing detached processes: %w", err)
	}
	for _, p := range resp.Msg.GetProcesses() {
		if p.GetId() != id {
			continue
		}
		if p.GetExited() {
			_, _ = conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: id}))
			return fmt.Errorf("process %d exited (exit code %d): %w", p.GetPid(), p.GetExitCode(), errdefs.ErrNotFound)
		}
		return nil
	}
	return fmt.Errorf("no detached process %s in the sandbox: %w", id, errdefs.ErrNotFound)
}

// forgetProcess deletes id's record (before it returns, so a session closed
// stays closed across a restart) and kills and forgets its detached process
// in the sandbox's agent in the background; either may be gone already.
func forgetProcess(agents Agents, st ProcessStore, log interface{ Warn(string, ...any) }, sandbox, id string) {
	if st != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := st.DeleteProcess(ctx, id); err != nil {
			log.Warn("deleting process record", "id", id, "err", err)
		}
		cancel()
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, release, err := agents.Agent(ctx, sandbox)
		if err != nil {
			return // the sandbox is gone, and its processes with it
		}
		defer release()
		_, err = conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: id}))
		if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			log.Warn("removing detached process", "id", id, "sandbox", sandbox, "err", err)
		}
	}()
}

// ReapUnrecorded kills and forgets the detached processes (shells of
// sessions, kernels of contexts) in the sandboxes ids that no record
// accounts for: those a crash left between starting them and recording
// them, whose clients were never given their ids. Call it once at start,
// after the sessions and contexts are restored and before serving (a
// process being created is unrecorded too). Stopped sandboxes are skipped.
func ReapUnrecorded(ctx context.Context, agents Agents, st ProcessStore, ids []string, log *slog.Logger) error {
	known := map[string]bool{}
	for _, kind := range []string{store.ProcessSession, store.ProcessContext} {
		recs, err := st.ListProcesses(ctx, kind)
		if err != nil {
			return fmt.Errorf("reap unrecorded processes: %w", err)
		}
		for _, r := range recs {
			known[r.ID] = true
		}
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(8, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				reapIn(ctx, agents, id, known, log)
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	return nil
}

// The prefixes of session and context ids.
const (
	sessionPrefix = "sess-"
	contextPrefix = "ctx-"
)

// ownID reports whether a detached process id is one this package hands
// out (a session's or a context's): the sandbox's entrypoint and processes
// others start are never reaped.
func ownID(id string) bool {
	return strings.HasPrefix(id, sessionPrefix) || strings.HasPrefix(id, contextPrefix)
}

func reapIn(ctx context.Context, agents Agents, sandbox string, known map[string]bool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, release, err := agents.Agent(ctx, sandbox)
	if err != nil {
		return // stopped, or gone
	}
	defer release()
	resp, err := conn.ListDetached(ctx, connect.NewRequest(&agentv1.ListDetachedRequest{}))
	if err != nil {
		if connect.CodeOf(err) != connect.CodeUnimplemented {
			log.Warn("listing detached processes", "sandbox", sandbox, "err", err)
		}
		return
	}
	for _, p := range resp.Msg.GetProcesses() {
		if known[p.GetId()] || !ownID(p.GetId()) {
			continue
		}
		_, err := conn.RemoveDetached(ctx, connect.NewRequest(&agentv1.RemoveDetachedRequest{Id: p.GetId()}))
		if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			log.Warn("removing unrecorded detached process", "sandbox", sandbox, "id", p.GetId(), "err", err)
			continue
		}
		log.Info("removed a detached process no record accounts for (started by a crashed daemon)", "sandbox", sandbox, "id", p.GetId())
	}
}
