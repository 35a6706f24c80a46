package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// parseCodebaseMounts parses --codebase NAME[:/path[:PRESET]] flags.
func parseCodebaseMounts(specs []string) ([]sbx.CodebaseMount, error) {
	var out []sbx.CodebaseMount
	for _, s := range specs {
		parts := strings.Split(s, ":")
		if parts[0] == "" || len(parts) > 3 {
			return nil, fmt.Errorf("--codebase %q: want NAME[:/path[:PRESET]]", s)
		}
		m := sbx.CodebaseMount{Codebase: parts[0]}
		if len(parts) > 1 {
			m.Path = parts[1]
		}
		if len(parts) > 2 {
			if parts[2] == "" {
				return nil, fmt.Errorf("--codebase %q: empty preset", s)
			}
			m.Preset = parts[2]
		}
		out = append(out, m)
	}
	return out, nil
}

func newCodebase(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "codebase", Aliases: []string{"codebases", "cb"}, Short: "Upload, mount and sync codebases"}
	cmd.AddCommand(newCodebaseCreate(a), newCodebaseLs(a), newCodebaseInspect(a), newCodebaseDownload(a),
		newCodebaseRm(a), newCodebaseSync(a))
	return cmd
}

func printSkipped(w io.Writer, skipped []*sbxv1.SkippedFile) {
	if len(skipped) == 0 {
		return
	}
	fmt.Fprintf(w, "skipped %d file(s):\n", len(skipped))
	for _, s := range skipped {
		size := ""
		if s.GetSizeBytes() > 0 {
			size = " (" + sandbox.FormatBytes(s.GetSizeBytes()) + ")"
		}
		fmt.Fprintf(w, "  %s%s: %s\n", s.GetPath(), size, s.GetReason())
	}
}

func newCodebaseCreate(a *app) *cobra.Command {
	var opts sbx.UploadOptions
	var maxSize string
	cmd := &cobra.Command{
		Use:   "create DIR",
		Short: "Upload a directory as a codebase (honours .gitignore and .sandboxignore) and print its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := parseSize(maxSize)
			if err != nil {
				return fmt.Errorf("--max-file-size: %w", err)
			}
			opts.MaxFileBytes = n
			if n == 0 {
				opts.MaxFileBytes = -1
			}
			resp, err := a.client().CreateCodebase(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			cb := resp.GetCodebase()
			fmt.Fprintln(a.stdout, cb.GetId())
			fmt.Fprintf(a.stderr, "%d files, %s\n", cb.GetFileCount(), sandbox.FormatBytes(cb.GetSizeBytes()))
			printSkipped(a.stderr, resp.GetSkipped())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Name, "name", "", "unique name")
	f.StringArrayVar(&opts.Ignore, "ignore", nil, "extra gitignore-style pattern (repeatable)")
	f.StringVar(&maxSize, "max-file-size", "10M", "skip (and report) larger files; 0: no limit")
	f.BoolVar(&opts.NoGit, "no-git", false, "leave the .git directory out")
	return cmd
}

func newCodebaseLs(a *app) *cobra.Command {
	var lf listFlags
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List codebases",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cbs, err := a.client().ListCodebases(cmd.Context())
			if err != nil {
				return err
			}
			return printList(a, lf, cbs,
				func(cb *sbxv1.Codebase) string { return cb.GetId() },
				func(cb *sbxv1.Codebase) any { return protoJSON(cb) },
				"ID\tNAME\tREVISION\tFILES\tSIZE\tCREATED\tSANDBOXES",
				func(cb *sbxv1.Codebase) []any {
					return []any{cb.GetId(), cb.GetName(), cb.GetRevision(), cb.GetFileCount(),
						sandbox.FormatBytes(cb.GetSizeBytes()), ago(cb.GetCreatedAtMs()), strings.Join(cb.GetSandboxes(), ",")}
				})
		},
	}
	lf.add(cmd, "print ids only")
	return cmd
}

func newCodebaseInspect(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID|NAME",
		Short: "Show a codebase as JSON (file count, size, revision, skipped files, sandboxes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cb, err := a.client().GetCodebase(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return writeJSON(a.stdout, protoJSON(cb))
		},
	}
}

func newCodebaseDownload(a *app) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "download ID|NAME",
		Short: "Download a codebase's current revision as a tar",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var w io.Writer = a.stdout
			if out != "" && out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if err := a.client().DownloadCodebase(cmd.Context(), args[0], w); err != nil {
				if out != "" && out != "-" {
					os.Remove(out)
				}
				return err
			}
			if f, ok := w.(*os.File); ok && f != os.Stdout {
				return f.Close()
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to this file (default: stdout)")
	return cmd
}

func newCodebaseRm(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID|NAME...",
		Short: "Delete codebases (refused while a sandbox mounts one)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			return a.eachRef(args, func(ref string) error { return c.DeleteCodebase(cmd.Context(), ref) })
		},
	}
}

func newCodebaseSync(a *app) *cobra.Command {
	var opts sbx.SyncOptions
	cmd := &cobra.Command{
		Use:               "sync SANDBOX",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Write a sandbox's changes under a codebase mount back into the codebase",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := a.client().SyncCodebase(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			verb := "wrote"
			if opts.DryRun {
				verb = "would write"
			}
			for _, p := range resp.GetWritten() {
				fmt.Fprintf(a.stdout, "%s %s\n", verb, p)
			}
			for _, p := range resp.GetDeleted() {
				fmt.Fprintf(a.stdout, "%s delete %s\n", verb, p)
			}
			for _, c := range resp.GetConflicts() {
				fmt.Fprintf(a.stderr, "conflict: %s: %s\n", c.GetPath(), c.GetReason())
			}
			fmt.Fprintf(a.stderr, "codebase %s at revision %d\n", resp.GetCodebase(), resp.GetRevision())
			if len(resp.GetConflicts()) > 0 && !opts.Force {
				fmt.Fprintln(a.stderr, "sbx: conflicts: nothing was written (use --force to overwrite)")
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Path, "path", "", "mount path of the codebase (default: the sandbox's only one)")
	f.BoolVar(&opts.DryRun, "dry-run", false, "show what would be written")
	f.BoolVar(&opts.Force, "force", false, "write conflicting paths too (the sandbox's version wins)")
	return cmd
}
