package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newLogs(a *app) *cobra.Command {
	var (
		follow bool
		since  string
		tail   int64
	)
	cmd := &cobra.Command{
		Use:               "logs [-f] [--since DUR|TIME] [--tail N] ID|NAME",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Print the output of a sandbox's own command (create's command, or its image's ENTRYPOINT/CMD)",
		Long: "Print the output of a sandbox's own command: its stdout here on stdout, its stderr on stderr.\n" +
			"The sandbox keeps the newest 1 MiB of each stream; older output is dropped, and how much is said on stderr.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := sbx.LogsOptions{Follow: follow, Stdout: a.stdout, Stderr: a.stderr}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				opts.Since = t
			}
			if tail >= 0 {
				if tail > 1<<32-1 {
					return fmt.Errorf("--tail %d: too large", tail)
				}
				opts.Tail = new(uint32(tail))
			}
			res, err := a.client().Sandbox(args[0]).Logs(cmd.Context(), opts)
			if res != nil && res.DroppedStdout+res.DroppedStderr > 0 {
				fmt.Fprintf(a.stderr, "sbx: %d bytes of stdout and %d of stderr were dropped (the sandbox keeps the newest 1 MiB of each)\n",
					res.DroppedStdout, res.DroppedStderr)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new output until the command exits")
	f.StringVar(&since, "since", "", "only output since a duration ago (e.g. 10m) or a time (RFC 3339)")
	f.Int64VarP(&tail, "tail", "n", -1, "only the last N lines (default: all)")
	return cmd
}

// parseSince reads --since: a duration before now, or an RFC 3339 time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %q: want a positive duration", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want a duration (10m) or an RFC 3339 time (2006-01-02T15:04:05Z)", s)
	}
	return t, nil
}

func newWait(a *app) *cobra.Command {
	return &cobra.Command{
		Use:               "wait ID|NAME",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Wait for a sandbox's own command to exit and print its exit code",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.client().Sandbox(args[0]).Wait(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, st.Code)
			if st.Signal != 0 {
				fmt.Fprintf(a.stderr, "sbx: killed by signal %d\n", st.Signal)
			}
			a.exitNotes(st, "command", "")
			return nil
		},
	}
}
