package sbx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// ExecOptions describe one command. Exactly one of Argv and Shell is set.
type ExecOptions struct {
	Argv    []string
	Shell   string
	Env     map[string]string
	Workdir string
	// User runs the command as this user (default: the sandbox's).
	User string
	// Timeout kills the command's whole process group (0: none).
	Timeout time.Duration
	// TTY runs the command under a pseudo-terminal of Rows×Cols.
	TTY        bool
	Rows, Cols uint32
	// Stdin, if set, is streamed to the command, then closed at EOF.
	Stdin io.Reader
	// Stdout and Stderr receive output as it arrives (nil: discarded).
	Stdout, Stderr io.Writer
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	// Code is the exit code; 128+signal when killed by a signal.
	Code     int
	Signal   int
	TimedOut bool
	// OOMKilled says the sandbox's memory limit killed it: it died by
	// SIGKILL while the sandbox's count of OOM kills rose (a heuristic;
	// see ExecExited.oom_killed).
	OOMKilled bool
	// PidsLimitHit says the command failed and the sandbox's pids limit
	// refused a fork (of any process of the sandbox) while it ran.
	PidsLimitHit bool
	// Error is set when the command could not be started.
	Error    string
	Duration time.Duration
}

// Result is a finished command with its collected output.
type Result struct {
	ExitStatus
	Stdout, Stderr []byte
}

// Run runs argv and collects its output. A non-zero exit is not an error.
func (s *Sandbox) Run(ctx context.Context, argv ...string) (*Result, error) {
	return s.RunOpts(ctx, ExecOptions{Argv: argv})
}

// RunShell runs a shell command line (/bin/sh -c) and collects its output.
func (s *Sandbox) RunShell(ctx context.Context, cmd string) (*Result, error) {
	return s.RunOpts(ctx, ExecOptions{Shell: cmd})
}

// RunOpts runs a command and collects its output in memory.
func (s *Sandbox) RunOpts(ctx context.Context, opts ExecOptions) (*Result, error) {
	var out, errb bytes.Buffer
	opts.Stdout, opts.Stderr = &out, &errb
	st, err := s.Exec(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &Result{ExitStatus: *st, Stdout: out.Bytes(), Stderr: errb.Bytes()}, nil
}

func (o ExecOptions) request(sandbox string) *sbxv1.ExecRequest {
	req := &sbxv1.ExecRequest{
		Sandbox: sandbox, Argv: o.Argv, Shell: o.Shell, Env: o.Env, Workdir: o.Workdir,
		TimeoutMs: o.Timeout.Milliseconds(), Tty: o.TTY, User: o.User,
	}
	if o.TTY {
		rows, cols := o.Rows, o.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		req.Size = &sbxv1.TerminalSize{Rows: rows, Cols: cols}
	}
	return req
}

// Exec runs a command, streaming its output to opts.Stdout and opts.Stderr.
func (s *Sandbox) Exec(ctx context.Context, opts ExecOptions) (*ExitStatus, error) {
	if opts.Stdin != nil {
		p, err := s.StartExec(ctx, opts)
		if err != nil {
			return nil, err
		}
		return p.Wait()
	}
	req := opts.request(s.ID)
	if !s.c.execs.off() {
		st, err := s.c.execUpgraded(ctx, req, opts.Stdout, opts.Stderr)
		if !errors.Is(err, errNoUpgrade) {
			return st, err
		}
	}
	stream, err := s.c.api.Exec(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrap("exec", err)
	}
	defer stream.Close()
	for stream.Receive() {
		if st, done, err := handleOutput(stream.Msg(), opts.Stdout, opts.Stderr); done || err != nil {
			return st, err
		}
	}
	return nil, wrap("exec", endedEarly(stream.Err()))
}

func endedEarly(err error) error {
	if err == nil {
		return errors.New("output stream ended before the command exited")
	}
	return err
}

// handleOutput writes one output event; done is true at the exit event.
func handleOutput(m *sbxv1.ExecOutput, stdout, stderr io.Writer) (*ExitStatus, bool, error) {
	switch ev := m.GetEvent().(type) {
	case *sbxv1.ExecOutput_Stdout:
		if stdout != nil {
			if _, err := stdout.Write(ev.Stdout); err != nil {
				return nil, true, fmt.Errorf("writing stdout: %w", err)
			}
		}
	case *sbxv1.ExecOutput_Stderr:
		if stderr != nil {
			if _, err := stderr.Write(ev.Stderr); err != nil {
				return nil, true, fmt.Errorf("writing stderr: %w", err)
			}
		}
	case *sbxv1.ExecOutput_Exited:
		return exitStatusOf(ev.Exited), true, nil
	}
	return nil, false, nil
}

// Process is a command started with StartExec. Its methods may be called
// from any goroutine.
type Process struct {
	stream *connect.BidiStreamForClient[sbxv1.ExecInput, sbxv1.ExecOutput]
	opts   ExecOptions

	sendMu sync.Mutex // serialises stream.Send

	done   chan struct{}
	status *ExitStatus
	err    error
}

// StartExec starts an interactive command: stdin is streamed and the
// terminal can be resized and signalled while it runs. Needs HTTP/2 to the
// daemon (the SDK's default transport).
func (s *Sandbox) StartExec(ctx context.Context, opts ExecOptions) (*Process, error) {
	stream := s.c.api.ExecInteractive(ctx)
	req := opts.request(s.ID)
	req.StdinOpen = opts.Stdin != nil
	p := &Process{stream: stream, opts: opts, done: make(chan struct{})}
	if err := p.send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: req}}); err != nil {
		stream.CloseRequest()  //nolint:errcheck
		stream.CloseResponse() //nolint:errcheck
		return nil, wrap("exec", err)
	}
	if opts.Stdin != nil {
		go p.copyStdin()
	}
	go p.receive()
	return p, nil
}

func (p *Process) send(m *sbxv1.ExecInput) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	return p.stream.Send(m)
}

func (p *Process) copyStdin() {
	buf := make([]byte, 32<<10)
	for {
		n, err := p.opts.Stdin.Read(buf)
		if n > 0 {
			if p.send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: bytes.Clone(buf[:n])}}) != nil {
				return
			}
		}
		if err != nil {
			_ = p.CloseStdin()
			return
		}
	}
}

func (p *Process) receive() {
	defer close(p.done)
	defer p.stream.CloseResponse() //nolint:errcheck
	for {
		m, err := p.stream.Receive()
		if err != nil {
			p.err = wrap("exec", endedEarly(ignoreEOF(err)))
			return
		}
		st, done, herr := handleOutput(m, p.opts.Stdout, p.opts.Stderr)
		if herr != nil {
			p.err = herr
			return
		}
		if done {
			p.status = st
			p.sendMu.Lock()
			_ = p.stream.CloseRequest()
			p.sendMu.Unlock()
			return
		}
	}
}

func ignoreEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// CloseStdin sends EOF to the command.
func (p *Process) CloseStdin() error {
	return p.send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}})
}

// Resize changes the terminal size of a TTY command.
func (p *Process) Resize(rows, cols uint32) error {
	return p.send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Resize{Resize: &sbxv1.TerminalSize{Rows: rows, Cols: cols}}})
}

// Signal sends a signal (e.g. 2 for SIGINT) to the command's process group.
func (p *Process) Signal(sig int) error {
	return p.send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Signal{Signal: int32(sig)}})
}

// Wait blocks until the command exits.
func (p *Process) Wait() (*ExitStatus, error) {
	<-p.done
	return p.status, p.err
}
