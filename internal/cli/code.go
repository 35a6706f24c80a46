package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

type runCodeFlags struct {
	sandbox, lang, context, out string
	libs, policies, env         []string
	findLinks                   []string
	indexURL                    string
	enforce                     bool
	threshold                   string
	timeout                     time.Duration
}

func newRunCode(a *app) *cobra.Command {
	var f runCodeFlags
	cmd := &cobra.Command{
		Use:   "run-code --lang L [flags] FILE|-",
		Short: "Run code (python, javascript, bash, cpp, ...) in a sandbox; exits with its exit code",
		Long: "Runs a program in a sandbox (a fresh one, destroyed afterwards, unless --sandbox or --context\n" +
			"is given), printing its output live and saving artifacts (plots, files written under\n" +
			"$SBX_OUTPUT_DIR) into --out.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runCode(cmd.Context(), f, args[0]) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.sandbox, "sandbox", "", "sandbox id or name (default: a temporary sandbox)")
	fl.StringVarP(&f.lang, "lang", "l", "", "language: python, javascript, typescript, bash, go, java, cpp, ruby, r")
	fl.StringVar(&f.context, "context", "", "run in this context (see `sbx context create`)")
	fl.StringVar(&f.out, "out", "", "save artifacts into this directory")
	fl.StringArrayVar(&f.libs, "lib", nil, "install a library first (repeatable)")
	fl.StringArrayVar(&f.findLinks, "find-links", nil, "install libraries from this directory in the sandbox (pip --find-links)")
	fl.StringVar(&f.indexURL, "index-url", "", "install libraries from this package index")
	fl.StringArrayVar(&f.policies, "policy", nil, "check the code against a policy preset (default, no-network, no-subprocess, no-filesystem)")
	fl.BoolVar(&f.enforce, "enforce", false, "refuse code with policy findings at or above --threshold")
	fl.StringVar(&f.threshold, "threshold", "high", "lowest blocking severity: low, medium, high, critical")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment KEY=VALUE (repeatable)")
	fl.DurationVar(&f.timeout, "timeout", 0, "stop the code after this long, e.g. 30s")
	return cmd
}

func (a *app) runCode(ctx context.Context, f runCodeFlags, file string) error {
	var code []byte
	var err error
	if file == "-" {
		code, err = io.ReadAll(a.stdin)
	} else {
		code, err = os.ReadFile(file)
	}
	if err != nil {
		return err
	}
	if f.lang == "" && f.context == "" {
		f.lang = langFromExt(file)
		if f.lang == "" {
			return fmt.Errorf("run-code: give --lang (cannot tell the language of %q)", file)
		}
	}
	env, err := parseEnv(f.env)
	if err != nil {
		return err
	}
	opts := sbx.RunCodeOptions{Libraries: f.libs, Timeout: f.timeout, Env: env, Stdout: a.stdout, Stderr: a.stderr}
	if f.indexURL != "" || len(f.findLinks) > 0 {
		opts.LibrarySource = &sbxv1.LibrarySource{IndexUrl: f.indexURL, FindLinks: f.findLinks}
	}
	if len(f.policies) > 0 {
		opts.Policy = &sbxv1.CodePolicy{Presets: f.policies, Mode: sbxv1.PolicyMode_POLICY_MODE_ADVISORY}
		if f.enforce {
			opts.Policy.Mode = sbxv1.PolicyMode_POLICY_MODE_ENFORCE
			sev, ok := sbxv1.Severity_value["SEVERITY_"+strings.ToUpper(f.threshold)]
			if !ok {
				return fmt.Errorf("run-code: unknown severity %q", f.threshold)
			}
			opts.Policy.Threshold = sbxv1.Severity(sev)
		}
	}
	c := a.client()
	var res *sbx.CodeResult
	switch {
	case f.context != "":
		res, err = c.Context(f.context).Run(ctx, string(code), opts)
	case f.sandbox != "":
		res, err = (&sbx.Sandbox{ID: f.sandbox}).WithClient(c).RunCode(ctx, f.lang, string(code), opts)
	default:
		sb, cerr := c.Create(ctx, sbx.CreateOptions{})
		if cerr != nil {
			return cerr
		}
		defer sb.Destroy(context.WithoutCancel(ctx)) //nolint:errcheck
		res, err = sb.RunCode(ctx, f.lang, string(code), opts)
	}
	if err != nil {
		return err
	}
	for _, fd := range res.Findings {
		fmt.Fprintf(a.stderr, "sbx: policy: line %d: %s [%s]: %s\n", fd.GetLine(), fd.GetRule(),
			protoEnumText(fd.GetSeverity()), fd.GetMessage())
	}
	if len(res.Installed) > 0 {
		fmt.Fprintf(a.stderr, "sbx: installed %s\n", strings.Join(res.Installed, ", "))
	}
	if v := res.Value; v != nil && v.GetText() != "" {
		fmt.Fprintln(a.stdout, v.GetText())
	}
	if err := saveArtifacts(f.out, res.Artifacts, a.stderr); err != nil {
		return err
	}
	if res.Error != "" && res.ExitCode == 0 {
		res.ExitCode = 1
	}
	if res.Error != "" && !strings.HasPrefix(res.Error, "exit code") {
		fmt.Fprintln(a.stderr, "sbx:", res.Error)
	}
	if res.ExitCode != 0 {
		return &ExitError{Code: res.ExitCode}
	}
	return nil
}

// saveArtifacts writes artifacts under dir (listing them when dir is empty).
func saveArtifacts(dir string, arts []*sbxv1.Artifact, log io.Writer) error {
	for _, art := range arts {
		if dir == "" {
			fmt.Fprintf(log, "sbx: artifact %s (%s, %d bytes; use --out DIR to save)\n", art.GetName(), art.GetMime(), art.GetSize())
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(art.GetName()))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("artifact %q escapes %s", art.GetName(), dir)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, art.GetContent(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(log, "sbx: saved %s (%s, %d bytes)\n", p, art.GetMime(), art.GetSize())
	}
	return nil
}

func langFromExt(file string) string {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".py":
		return "python"
	case ".js", ".mjs", ".cjs":
		return "javascript"
	case ".ts":
		return "typescript"
	case ".sh", ".bash":
		return "bash"
	case ".go":
		return "go"
	case ".java":
		return "java"
	case ".cpp", ".cc", ".cxx":
		return "cpp"
	case ".rb":
		return "ruby"
	case ".r":
		return "r"
	}
	return ""
}

func newContext(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "context", Short: "Manage stateful code contexts (kernels)"}
	var cwd string
	create := &cobra.Command{
		Use:               "create SANDBOX LANG",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Start a context; prints its id",
		Args:              cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cc, err := (&sbx.Sandbox{ID: args[0]}).WithClient(a.client()).CreateContext(cmd.Context(), args[1], sbx.ContextOptions{Cwd: cwd})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, cc.ID)
			return nil
		},
	}
	create.Flags().StringVar(&cwd, "cwd", "", "initial working directory")
	var lf listFlags
	ls := &cobra.Command{
		Use:               "ls [SANDBOX]",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "List contexts",
		Args:              cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := a.client().Contexts(cmd.Context(), strings.Join(args, ""))
			if err != nil {
				return err
			}
			return printList(a, lf, list,
				func(cc *sbx.CodeContext) string { return cc.ID },
				func(cc *sbx.CodeContext) any { return protoJSON(cc.Info) },
				"ID\tSANDBOX\tLANGUAGE\tCREATED\tRUNS",
				func(cc *sbx.CodeContext) []any {
					return []any{cc.ID, cc.Sandbox, cc.Language, ago(cc.Info.GetCreatedMs()), cc.Info.GetRuns()}
				})
		},
	}
	lf.add(ls, "print ids only")
	rm := &cobra.Command{
		Use:   "rm CONTEXT...",
		Short: "Close contexts",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := a.client().Context(id).Close(cmd.Context()); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
