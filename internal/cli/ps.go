package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// Background processes: `exec -d` starts one, ps lists them, attach
// replays and follows one (forwarding stdin), kill signals one, and the
// proc group waits for, feeds and removes them.

// runDetached starts argv in sb as a background process and prints its pid.
func (a *app) runDetached(ctx context.Context, sb *sbx.Sandbox, ef execFlags, argv []string) error {
	env, err := parseEnv(ef.env)
	if err != nil {
		return err
	}
	opts := sbx.BackgroundOptions{
		Argv: argv, Env: env, Workdir: ef.workdir, User: ef.user, Timeout: ef.timeout, TTY: ef.tty,
		StdinOpen: ef.interactive, Tag: ef.tag,
	}
	if ef.tty {
		opts.Rows, opts.Cols = 24, 80
		if ws, err := unix.IoctlGetWinsize(int(os.Stdin.Fd()), unix.TIOCGWINSZ); err == nil {
			opts.Rows, opts.Cols = uint32(ws.Row), uint32(ws.Col)
		}
	}
	p, err := sb.StartBackground(ctx, opts)
	if err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, p.PID)
	return nil
}

func newPs(a *app) *cobra.Command {
	var lf listFlags
	cmd := &cobra.Command{
		Use:               "ps [ID|NAME]",
		Short:             "List a sandbox's background processes (exec -d), running and recently exited; without ID, the sandboxes",
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				// `sbx ps` lists sandboxes, as it did when it was ls's alias.
				ls := newLs(a)
				ls.SetContext(cmd.Context())
				for flag, on := range map[string]bool{"json": lf.json, "quiet": lf.quiet} {
					if on {
						if err := ls.Flags().Set(flag, "true"); err != nil {
							return err
						}
					}
				}
				return ls.RunE(ls, nil)
			}
			list, err := a.client().Sandbox(args[0]).Processes(cmd.Context())
			if err != nil {
				return err
			}
			return printList(a, lf, list,
				func(p *sbx.BackgroundProcess) string { return strconv.Itoa(p.PID) },
				func(p *sbx.BackgroundProcess) any { return protoJSON(p.Info) },
				"PID\tID\tTAG\tSTATUS\tSTARTED\tCOMMAND",
				func(p *sbx.BackgroundProcess) []any {
					return []any{p.PID, p.ID, p.Tag, processStatus(p), ago(p.Started.UnixMilli()), strings.Join(p.Command, " ")}
				})
		},
	}
	lf.add(cmd, "print pids only (without ID: sandbox ids)")
	return cmd
}

// completeProcess completes a sandbox first, then (max processes, -1: any
// number) that sandbox's background processes by pid and tag.
func (a *app) completeProcess(max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return a.sandboxCompletions(cmd, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
		}
		if max >= 0 && len(args) > max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		list, err := a.client().Sandbox(args[0]).Processes(cmd.Context())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp // no errors into the shell
		}
		var out []cobra.Completion
		for _, p := range list {
			for _, c := range []string{strconv.Itoa(p.PID), p.Tag} {
				if c != "" && strings.HasPrefix(c, toComplete) {
					out = append(out, c)
				}
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// processStatus is ps's STATUS column.
func processStatus(p *sbx.BackgroundProcess) string {
	switch {
	case p.Exit == nil:
		return "running"
	case p.Exit.OOMKilled:
		return "out of memory"
	case p.Exit.TimedOut:
		return "timed out"
	case p.Exit.Signal != 0:
		return fmt.Sprintf("killed (signal %d)", p.Exit.Signal)
	}
	return fmt.Sprintf("exited (%d)", p.Exit.Code)
}

// detachKeys end an attach to a terminal without touching the process
// (Ctrl-P Ctrl-Q, as docker's).
var detachKeys = []byte{0x10, 0x11}

func newAttach(a *app) *cobra.Command {
	var (
		tail       int64
		noStdin    bool
		closeStdin bool
	)
	cmd := &cobra.Command{
		Use:   "attach [flags] ID|NAME PROCESS",
		Short: "Replay a background process's output, follow it and forward stdin; exits with its exit code",
		Long: "Replay the output a background process has kept (the newest 256 KiB of each stream), then follow it until it exits,\n" +
			"exiting with its exit code. PROCESS is its pid, id or tag. Stdin is forwarded if the process takes it (exec -d -i or -t);\n" +
			"on a terminal, Ctrl-P Ctrl-Q detaches. Ending attach never stops the process: use kill.",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: a.completeProcess(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := sbx.ConnectOptions{Follow: true, Stdout: a.stdout, Stderr: a.stderr}
			if tail >= 0 {
				if tail > 1<<32-1 {
					return fmt.Errorf("--tail %d: too large", tail)
				}
				opts.Tail = new(uint32(tail))
			}
			return a.attach(cmd.Context(), a.client().Sandbox(args[0]), args[1], opts, !noStdin, closeStdin)
		},
	}
	f := cmd.Flags()
	f.Int64VarP(&tail, "tail", "n", -1, "replay only the last N lines of the kept output (default: all)")
	f.BoolVar(&noStdin, "no-stdin", false, "do not forward stdin")
	f.BoolVar(&closeStdin, "close-stdin", false, "close the process's stdin when stdin here ends (default: leave it open for later)")
	return cmd
}

// attach follows process ref of sb, forwarding stdin if asked and the
// process takes it, and returns an ExitError with its exit code.
func (a *app) attach(ctx context.Context, sb *sbx.Sandbox, ref string, opts sbx.ConnectOptions, fwd, closeAtEOF bool) error {
	p, err := sb.Process(ctx, ref)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errDetached := errors.New("detached")
	in := a.stdin
	fd := int(os.Stdin.Fd())
	_, werr := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	term := werr == nil && in == io.Reader(os.Stdin) // stdin here is a terminal
	if p.TTY && term && p.Running {
		if ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err == nil {
			_ = p.Resize(ctx, uint32(ws.Row), uint32(ws.Col))
		}
		if restore, err := makeRaw(fd); err == nil {
			defer restore()
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err == nil {
					_ = p.Resize(ctx, uint32(ws.Row), uint32(ws.Col))
				}
			}
		}()
	}
	if fwd && p.StdinOpen && p.Running {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, rerr := in.Read(buf)
				if n > 0 {
					data := buf[:n]
					if p.TTY && term && bytes.Contains(data, detachKeys) {
						cancel(errDetached)
						return
					}
					if err := p.SendStdin(ctx, data); err != nil {
						fmt.Fprintln(a.stderr, "sbx: stdin:", err)
						return
					}
				}
				if rerr != nil {
					if closeAtEOF && !p.TTY {
						_ = p.CloseStdin(ctx)
					}
					return
				}
			}
		}()
	}
	var dropped [2]uint64
	opts.OnDropped = func(o, e uint64) { dropped[0] += o; dropped[1] += e }
	st, err := p.Connect(ctx, opts)
	if dropped != [2]uint64{} {
		fmt.Fprintf(a.stderr, "sbx: %d bytes of stdout and %d of stderr were dropped (the sandbox keeps the newest of each stream)\n", dropped[0], dropped[1])
	}
	if errors.Is(context.Cause(ctx), errDetached) {
		fmt.Fprintf(a.stderr, "\r\nsbx: detached from process %d (it runs on)\r\n", p.PID)
		return nil
	}
	if err != nil {
		return err
	}
	if st == nil {
		return fmt.Errorf("attach: the output of process %d ended before it exited", p.PID)
	}
	return a.exitStatus(st, "process", "")
}

// parseSignal reads a signal as a number (15), a name (TERM) or SIGTERM.
func parseSignal(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal %d: want 1 to 64", n)
		}
		return n, nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if n := unix.SignalNum(name); n != 0 {
		return int(n), nil
	}
	return 0, fmt.Errorf("unknown signal %q: want a number or a name such as TERM, KILL, INT, HUP", s)
}

func newKill(a *app) *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:               "kill [-s SIGNAL] ID|NAME PROCESS...",
		Short:             "Send a signal (default KILL) to background processes' groups (by pid, id or tag)",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: a.completeProcess(-1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				// kill used to be rm's alias: say so rather than guess.
				return errors.New("kill signals a sandbox's background processes: sbx kill [-s SIGNAL] ID PROCESS... (to destroy a sandbox: sbx rm ID)")
			}
			n, err := parseSignal(sig)
			if err != nil {
				return err
			}
			sb := a.client().Sandbox(args[0])
			for _, ref := range args[1:] {
				p, err := sb.Process(cmd.Context(), ref)
				if err != nil {
					return err
				}
				if err := p.Signal(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "KILL", "signal: a name (TERM, INT, HUP...) or a number")
	return cmd
}

func newProc(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "proc", Short: "Wait for, feed and remove background processes (see also exec -d, ps, attach, kill)"}
	wait := &cobra.Command{
		Use:               "wait ID|NAME PROCESS",
		Short:             "Wait for a background process to exit and print its exit code",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: a.completeProcess(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := a.client().Sandbox(args[0]).Process(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			st, err := p.Wait(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, st.Code)
			a.exitNotes(st, "process", "")
			return nil
		},
	}
	var closeAfter bool
	send := &cobra.Command{
		Use:               "send [--close] ID|NAME PROCESS [DATA]",
		Short:             "Write DATA (default: all of stdin here) to a background process's stdin",
		Args:              cobra.RangeArgs(2, 3),
		ValidArgsFunction: a.completeProcess(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := a.client().Sandbox(args[0]).Process(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			var data []byte
			if len(args) == 3 {
				data = []byte(args[2])
			} else if data, err = io.ReadAll(io.LimitReader(a.stdin, 4<<20+1)); err != nil {
				return fmt.Errorf("reading stdin: %w", err)
			} else if len(data) > 4<<20 {
				return errors.New("stdin is more than 4 MiB: send it in parts")
			}
			if len(data) > 0 {
				if err := p.SendStdin(cmd.Context(), data); err != nil {
					return err
				}
			}
			if closeAfter {
				return p.CloseStdin(cmd.Context())
			}
			return nil
		},
	}
	send.Flags().BoolVar(&closeAfter, "close", false, "then close its stdin (EOF)")
	rm := &cobra.Command{
		Use:               "rm ID|NAME PROCESS...",
		Short:             "Kill background processes (if running) and forget them",
		Args:              cobra.MinimumNArgs(2),
		ValidArgsFunction: a.completeProcess(-1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb := a.client().Sandbox(args[0])
			for _, ref := range args[1:] {
				p, err := sb.Process(cmd.Context(), ref)
				if err != nil {
					return err
				}
				if err := p.Remove(cmd.Context()); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(wait, send, rm)
	return cmd
}
