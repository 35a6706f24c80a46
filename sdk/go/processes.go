package sbx

import (
	"context"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// Background processes (sbx.v1 ProcessService) run on after the call that
// started them, the client that made it and a daemon restart: any client
// lists them, replays and follows their output (the newest bytes of each
// stream are kept), sends them stdin, signals them and waits for them.
// Exec and StartExec instead kill the command when their client goes away.

// BackgroundOptions describe a background process. Exactly one of Argv and
// Shell is set.
type BackgroundOptions struct {
	Argv    []string
	Shell   string
	Env     map[string]string
	Workdir string
	User    string
	// Timeout kills the process group after this long (0: never).
	Timeout time.Duration
	// TTY runs it under a pseudo-terminal of Rows×Cols (stdin stays open).
	TTY        bool
	Rows, Cols uint32
	// Stdin is written first; stdin is then closed unless StdinOpen (or TTY).
	Stdin     []byte
	StdinOpen bool
	// Tag is a label to find the process by later (not all digits).
	Tag string
}

// BackgroundProcess is a background process as last seen.
type BackgroundProcess struct {
	c       *Client
	Sandbox string
	// ID is "proc-..."; PID is its pid in the sandbox.
	ID      string
	PID     int
	Tag     string
	Command []string
	TTY     bool
	// StdinOpen says SendStdin works.
	StdinOpen bool
	Started   time.Time
	Running   bool
	// Exit is set once it has exited.
	Exit *ExitStatus
	// Output its ring no longer holds, per stream.
	DroppedStdout, DroppedStderr uint64
	// Env and Workdir are the start request's, as given.
	Env     map[string]string
	Workdir string
	// Info is the record these fields come from.
	Info *sbxv1.ProcessInfo
}

func (c *Client) processes() sbxv1connect.ProcessServiceClient { return c.procs }

func (c *Client) backgroundProcess(pi *sbxv1.ProcessInfo) *BackgroundProcess {
	p := &BackgroundProcess{
		c: c, Sandbox: pi.GetSandbox(), ID: pi.GetId(), PID: int(pi.GetPid()), Tag: pi.GetTag(), Command: pi.GetCommand(),
		TTY: pi.GetTty(), StdinOpen: pi.GetStdinOpen(), Started: time.UnixMilli(pi.GetStartedMs()), Running: pi.GetRunning(),
		DroppedStdout: pi.GetDroppedStdoutBytes(), DroppedStderr: pi.GetDroppedStderrBytes(),
		Env: pi.GetEnv(), Workdir: pi.GetWorkdir(), Info: pi,
	}
	if ex := pi.GetExited(); ex != nil {
		p.Exit = exitStatusOf(ex)
	}
	return p
}

// StartBackground starts a background process and returns at once.
func (s *Sandbox) StartBackground(ctx context.Context, opts BackgroundOptions) (*BackgroundProcess, error) {
	req := ExecOptions{
		Argv: opts.Argv, Shell: opts.Shell, Env: opts.Env, Workdir: opts.Workdir, User: opts.User,
		Timeout: opts.Timeout, TTY: opts.TTY, Rows: opts.Rows, Cols: opts.Cols,
	}.request(s.ID)
	req.Stdin, req.StdinOpen = opts.Stdin, opts.StdinOpen
	resp, err := s.c.processes().StartProcess(ctx, connect.NewRequest(&sbxv1.StartProcessRequest{Exec: req, Tag: opts.Tag}))
	if err != nil {
		return nil, wrap("start process", err)
	}
	return s.c.backgroundProcess(resp.Msg.GetProcess()), nil
}

// Processes lists the sandbox's background processes, running and exited
// (until their records are reaped), oldest first.
func (s *Sandbox) Processes(ctx context.Context) ([]*BackgroundProcess, error) {
	resp, err := s.c.processes().ListProcesses(ctx, connect.NewRequest(&sbxv1.ListProcessesRequest{Sandbox: s.ID}))
	if err != nil {
		return nil, wrap("list processes", err)
	}
	var out []*BackgroundProcess
	for _, pi := range resp.Msg.GetProcesses() {
		out = append(out, s.c.backgroundProcess(pi))
	}
	return out, nil
}

// Process finds a background process by id, pid (decimal) or tag.
func (s *Sandbox) Process(ctx context.Context, ref string) (*BackgroundProcess, error) {
	resp, err := s.c.processes().GetProcess(ctx, connect.NewRequest(&sbxv1.GetProcessRequest{Sandbox: s.ID, Process: ref}))
	if err != nil {
		return nil, wrap("get process", err)
	}
	return s.c.backgroundProcess(resp.Msg.GetProcess()), nil
}

// ConnectOptions tune BackgroundProcess.Connect.
type ConnectOptions struct {
	// Follow keeps streaming until the process exits.
	Follow bool
	// Tail, if set, replays only the last this many lines of what is kept.
	Tail *uint32
	// Stdout and Stderr receive the output (nil: discarded).
	Stdout, Stderr io.Writer
	// OnDropped is told how much output the ring dropped before this
	// client read it.
	OnDropped func(stdout, stderr uint64)
}

// Connect replays the process's kept output and, with Follow, streams new
// output until it exits. It returns the exit status if the process has
// exited (nil, nil otherwise: not following, or it ran on).
func (p *BackgroundProcess) Connect(ctx context.Context, opts ConnectOptions) (*ExitStatus, error) {
	st, err := p.c.processes().ConnectProcess(ctx, connect.NewRequest(&sbxv1.ConnectProcessRequest{
		Sandbox: p.Sandbox, Process: p.ID, Follow: opts.Follow, Tail: opts.Tail,
	}))
	if err != nil {
		return nil, wrap("connect process", err)
	}
	defer st.Close()
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.ProcessEvent_Stdout:
			if opts.Stdout != nil {
				if _, err := opts.Stdout.Write(ev.Stdout); err != nil {
					return nil, fmt.Errorf("writing stdout: %w", err)
				}
			}
		case *sbxv1.ProcessEvent_Stderr:
			if opts.Stderr != nil {
				if _, err := opts.Stderr.Write(ev.Stderr); err != nil {
					return nil, fmt.Errorf("writing stderr: %w", err)
				}
			}
		case *sbxv1.ProcessEvent_Dropped:
			if opts.OnDropped != nil {
				opts.OnDropped(ev.Dropped.GetStdoutBytes(), ev.Dropped.GetStderrBytes())
			}
		case *sbxv1.ProcessEvent_Exited:
			return exitStatusOf(ev.Exited), nil
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrap("connect process", err)
	}
	return nil, nil
}

func (p *BackgroundProcess) input(ctx context.Context, req *sbxv1.SendProcessInputRequest) error {
	req.Sandbox, req.Process = p.Sandbox, p.ID
	_, err := p.c.processes().SendProcessInput(ctx, connect.NewRequest(req))
	return wrap("send process input", err)
}

// SendStdin writes data to the process's stdin (started with StdinOpen or
// TTY). It fails with DeadlineExceeded if the process does not take it
// within a few seconds.
func (p *BackgroundProcess) SendStdin(ctx context.Context, data []byte) error {
	return p.input(ctx, &sbxv1.SendProcessInputRequest{Stdin: data})
}

// CloseStdin gives the process end-of-file on stdin (^D on a terminal).
func (p *BackgroundProcess) CloseStdin(ctx context.Context) error {
	return p.input(ctx, &sbxv1.SendProcessInputRequest{StdinClose: true})
}

// Resize resizes the process's terminal.
func (p *BackgroundProcess) Resize(ctx context.Context, rows, cols uint32) error {
	return p.input(ctx, &sbxv1.SendProcessInputRequest{Resize: &sbxv1.TerminalSize{Rows: rows, Cols: cols}})
}

// Signal sends sig to the process's group.
func (p *BackgroundProcess) Signal(ctx context.Context, sig int) error {
	_, err := p.c.processes().SignalProcess(ctx, connect.NewRequest(&sbxv1.SignalProcessRequest{Sandbox: p.Sandbox, Process: p.ID, Signal: int32(sig)}))
	return wrap("signal process", err)
}

// Kill SIGKILLs the process's group; its exit status stays to be waited for.
func (p *BackgroundProcess) Kill(ctx context.Context) error { return p.Signal(ctx, 9) }

// Wait returns the process's exit status once it has exited. It leaves p
// as it was (p's fields are the record when p was made, so one handle can
// be waited on, signalled and read from several goroutines at once); call
// Sandbox.Process for a fresh record.
func (p *BackgroundProcess) Wait(ctx context.Context) (*ExitStatus, error) {
	resp, err := p.c.processes().WaitProcess(ctx, connect.NewRequest(&sbxv1.WaitProcessRequest{Sandbox: p.Sandbox, Process: p.ID}))
	if err != nil {
		return nil, wrap("wait process", err)
	}
	return p.c.backgroundProcess(resp.Msg.GetProcess()).Exit, nil
}

// Remove kills the process's group if it runs and forgets it.
func (p *BackgroundProcess) Remove(ctx context.Context) error {
	_, err := p.c.processes().RemoveProcess(ctx, connect.NewRequest(&sbxv1.RemoveProcessRequest{Sandbox: p.Sandbox, Process: p.ID}))
	return wrap("remove process", err)
}
