package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newSession(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "session", Short: "Manage stateful shell sessions (cwd, env, venvs and background jobs persist)"}
	var shell, workdir string
	var env []string
	create := &cobra.Command{
		Use:               "create SANDBOX",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Start a shell session; prints its id",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := parseEnv(env)
			if err != nil {
				return err
			}
			ss, err := (&sbx.Sandbox{ID: args[0]}).WithClient(a.client()).CreateSession(cmd.Context(), sbx.SessionOptions{Shell: shell, Env: e, Workdir: workdir})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, ss.ID)
			return nil
		},
	}
	create.Flags().StringVar(&shell, "shell", "", "shell program (default: /bin/bash)")
	create.Flags().StringVarP(&workdir, "workdir", "w", "", "initial working directory")
	create.Flags().StringArrayVarP(&env, "env", "e", nil, "environment KEY=VALUE (repeatable)")
	var timeout time.Duration
	exec := &cobra.Command{
		Use:   "exec [flags] SESSION COMMAND...",
		Short: "Run a command line in a session; exits with its exit code",
		Args:  commandArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.client().Session(args[0]).Exec(cmd.Context(), strings.Join(dropDashes(args[1:]), " "),
				sbx.SessionExecOptions{Timeout: timeout, Stdout: a.stdout, Stderr: a.stderr})
			if err != nil {
				return err
			}
			if res.TimedOut {
				fmt.Fprintln(a.stderr, "sbx: command timed out and was interrupted")
			}
			if res.Error != "" {
				fmt.Fprintln(a.stderr, "sbx: "+res.Error)
			}
			if res.ExitCode != 0 {
				return &ExitError{Code: res.ExitCode}
			}
			return nil
		},
	}
	exec.Flags().SetInterspersed(false)
	exec.Flags().DurationVar(&timeout, "timeout", 0, "interrupt the command after this long, e.g. 30s (the session survives)")
	var lf listFlags
	ls := &cobra.Command{
		Use:               "ls [SANDBOX]",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "List sessions",
		Args:              cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := a.client().Sessions(cmd.Context(), strings.Join(args, ""))
			if err != nil {
				return err
			}
			return printList(a, lf, list,
				func(ss *sbx.Session) string { return ss.ID },
				func(ss *sbx.Session) any { return protoJSON(ss.Info) },
				"ID\tSANDBOX\tSHELL\tCREATED\tEXECS",
				func(ss *sbx.Session) []any {
					return []any{ss.ID, ss.Sandbox, ss.Shell, ago(ss.Info.GetCreatedMs()), ss.Info.GetExecs()}
				})
		},
	}
	lf.add(ls, "print ids only")
	rm := &cobra.Command{
		Use:   "rm SESSION...",
		Short: "Close sessions, killing everything they started",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := a.client().Session(id).Close(cmd.Context()); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, exec, ls, rm)
	return cmd
}
