package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/server"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

type execFlags struct {
	interactive, tty bool
	detach           bool   // start in the background (ps.go)
	tag              string // with detach
	env              []string
	workdir, user    string
	timeout          time.Duration
}

func newExec(a *app) *cobra.Command {
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] ID|NAME CMD [ARG...]",
		Short: "Run a command in a sandbox; exits with its exit code (-d: in the background)",
		Long: "Run a command in a sandbox; exits with its exit code. sbx's own flags go before ID|NAME:\n" +
			"everything after it is the command and its arguments (sbx exec box python3 -c 'print(1)').\n" +
			"A -- after ID|NAME is allowed and dropped.\n" +
			"The command is killed if this client goes away (Ctrl-C, a dropped connection), so nothing runs on unseen.\n" +
			"With -d it runs in the background instead: its pid is printed, it survives this client and a daemon\n" +
			"restart, and ps, attach, kill and proc manage it.",
		Args:              commandArgs(1),
		ValidArgsFunction: a.completeSandboxes(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runExecRef(cmd.Context(), args[0], ef, dropDashes(args[1:]))
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.BoolVarP(&ef.interactive, "interactive", "i", false, "stream stdin to the command")
	f.BoolVarP(&ef.tty, "tty", "t", false, "allocate a pseudo-terminal")
	f.StringArrayVarP(&ef.env, "env", "e", nil, "environment KEY=VALUE (repeatable)")
	f.StringVarP(&ef.workdir, "workdir", "w", "", "working directory")
	f.StringVarP(&ef.user, "user", "u", "", "run as this user (name, uid or uid:gid)")
	f.DurationVar(&ef.timeout, "timeout", 0, "kill the command after this long, e.g. 30s")
	f.BoolVarP(&ef.detach, "detach", "d", false, "run in the background and print its pid (see ps, attach, kill); with -i its stdin stays open for attach")
	f.StringVar(&ef.tag, "tag", "", "with -d: a label to find the process by")
	return cmd
}

// commandArgs accepts n leading arguments followed by a command (at least one
// word, after an optional --).
func commandArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n || len(dropDashes(args[n:])) == 0 {
			return fmt.Errorf("no command given; usage: %s", cmd.UseLine())
		}
		return nil
	}
}

// dropDashes drops the -- that may stand before a command: with flags
// parsed up to the first argument only (SetInterspersed(false)), a -- after
// that argument reaches the command's arguments.
func dropDashes(argv []string) []string {
	if len(argv) > 0 && argv[0] == "--" {
		return argv[1:]
	}
	return argv
}

// runExecRef runs argv in the sandbox with id or name ref. The exec request
// carries ref as it is and the daemon resolves it (a map lookup): no
// GetSandbox first, which would measure the box (cgroups, disk, the host's
// connection table) before the command could start.
func (a *app) runExecRef(ctx context.Context, ref string, ef execFlags, argv []string) error {
	return a.runExec(ctx, a.client().Sandbox(ref), ef, argv)
}

// runExec runs argv in sb wired to this terminal and returns an ExitError
// carrying the command's exit code.
func (a *app) runExec(ctx context.Context, sb *sbx.Sandbox, ef execFlags, argv []string) error {
	if ef.detach {
		return a.runDetached(ctx, sb, ef, argv)
	}
	if ef.tag != "" {
		return errors.New("--tag needs -d (it labels a background process)")
	}
	env, err := parseEnv(ef.env)
	if err != nil {
		return err
	}
	opts := sbx.ExecOptions{
		Argv: argv, Env: env, Workdir: ef.workdir, User: ef.user, Timeout: ef.timeout, TTY: ef.tty,
		Stdout: a.stdout, Stderr: a.stderr,
	}
	if ef.interactive {
		opts.Stdin = a.stdin
	}
	var st *sbx.ExitStatus
	if ef.tty {
		st, err = a.execTTY(ctx, sb, opts)
	} else {
		st, err = sb.Exec(ctx, opts)
	}
	if err != nil {
		return err
	}
	if st.Error != "" {
		fmt.Fprintln(a.stderr, "sbx:", st.Error)
	}
	return a.exitStatus(st, "command", fmt.Sprintf(" after %s", ef.timeout))
}

// exitStatus says on stderr why a command or process (what) ended when the
// daemon knows a reason (a timeout, with timeout's words, the memory or pids
// limit) and returns its exit code as an ExitError.
func (a *app) exitStatus(st *sbx.ExitStatus, what, timeout string) error {
	a.exitNotes(st, what, timeout)
	if st.Code != 0 {
		return &ExitError{Code: st.Code}
	}
	return nil
}

// exitNotes is exitStatus's stderr lines alone.
func (a *app) exitNotes(st *sbx.ExitStatus, what, timeout string) {
	if st.TimedOut {
		fmt.Fprintf(a.stderr, "sbx: %s timed out%s\n", what, timeout)
	}
	if st.OOMKilled {
		fmt.Fprintf(a.stderr, "sbx: %s killed by the memory limit (OOM); raise it with `sbx update --memory`\n", what)
	}
	if st.PidsLimitHit {
		fmt.Fprintf(a.stderr, "sbx: the sandbox's pids limit refused a fork while the %s ran; raise it with `sbx update --pids`\n", what)
	}
}

// execTTY puts the local terminal in raw mode, forwards window size changes
// and restores the terminal afterwards.
func (a *app) execTTY(ctx context.Context, sb *sbx.Sandbox, opts sbx.ExecOptions) (*sbx.ExitStatus, error) {
	fd := int(os.Stdin.Fd())
	if ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err == nil {
		opts.Rows, opts.Cols = uint32(ws.Row), uint32(ws.Col)
	}
	if opts.Stdin == nil {
		opts.Stdin = a.stdin
	}
	if restore, err := makeRaw(fd); err == nil {
		defer restore()
	}
	p, err := sb.StartExec(ctx, opts)
	if err != nil {
		return nil, err
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err == nil {
				_ = p.Resize(uint32(ws.Row), uint32(ws.Col))
			}
		}
	}()
	return p.Wait()
}

func clientVersion() string { return server.Version }
