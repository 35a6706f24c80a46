package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

type createFlags struct {
	image, name, workdir, memory, disk      string
	labels, env, secrets                    []string
	cpus                                    float64
	pids                                    int64
	timeout, idleTimeout                    time.Duration
	stopWhenIdle, scopedToken, noEntrypoint bool
	autoResume                              bool
	runtime, user                           string
	net                                     netFlags
	volumes                                 []string
	secretFor                               []string // NAME[=VALUE]@domain,...
	guard                                   guardFlags
	codebases                               []string
}

// netFlags are the network policy flags of create, run and network.
type netFlags struct {
	mode                           string
	allowCIDRs, allowDomains, deny []string
}

func (n *netFlags) add(f *pflag.FlagSet, modeFlag string) {
	f.StringVar(&n.mode, modeFlag, "", "network mode: none, public (default; none on runtimes without the network capability, e.g. kubernetes) or allow")
	f.StringArrayVar(&n.allowCIDRs, "allow-cidr", nil, "reachable CIDR (mode allow), or a hole in the blocked ranges (public); never opens the host's own addresses; repeatable")
	f.StringArrayVar(&n.allowDomains, "allow-domain", nil, `reachable domain, "*.example.com" wildcards allowed (mode allow); repeatable`)
	f.StringArrayVar(&n.deny, "deny-cidr", nil, "CIDR blocked in every mode; repeatable")
}

// check names a mode that is none of the three (the daemon would see only
// an unknown number).
func (n *netFlags) check(flag string) error {
	switch strings.ToLower(n.mode) {
	case "", "none", "public", "allow":
		return nil
	}
	return fmt.Errorf("--%s %q: want none, public or allow", flag, n.mode)
}

func (n *netFlags) policy() *sbx.NetworkPolicy {
	if n.mode == "" && len(n.allowCIDRs)+len(n.allowDomains)+len(n.deny) == 0 {
		return nil
	}
	return &sbx.NetworkPolicy{Mode: n.mode, AllowCIDRs: n.allowCIDRs, AllowDomains: n.allowDomains, DenyCIDRs: n.deny}
}

func (c *createFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.image, "image", "", "image (default: host)")
	f.StringVar(&c.name, "name", "", "unique name")
	f.StringArrayVarP(&c.labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	f.StringArrayVarP(&c.env, "env", "e", nil, "environment KEY=VALUE or KEY (repeatable)")
	f.StringArrayVar(&c.secrets, "secret", nil, "secret KEY=VALUE, injected as env but never shown (repeatable)")
	f.StringArrayVar(&c.secretFor, "secret-for", nil, secretForHelp)
	f.StringVarP(&c.workdir, "workdir", "w", "", "working directory")
	f.StringVarP(&c.memory, "memory", "m", "", "memory limit, e.g. 512M")
	f.Float64Var(&c.cpus, "cpus", 0, "CPU limit, e.g. 0.5")
	f.Int64Var(&c.pids, "pids", 0, "process limit")
	f.StringVar(&c.disk, "disk", "", "size of the writable layer, e.g. 1G")
	f.DurationVar(&c.timeout, "timeout", 0, "lifetime, e.g. 10m (default: the daemon's)")
	f.DurationVar(&c.idleTimeout, "idle-timeout", 0, "destroy after this long without activity")
	f.BoolVar(&c.stopWhenIdle, "stop-when-idle", false, "stop instead of destroy at the idle timeout")
	f.BoolVar(&c.autoResume, "auto-resume", false, "start the sandbox again when it is used (exec, files) while stopped")
	f.BoolVar(&c.scopedToken, "scoped-token", false, "give the sandbox an API token (env SBX_TOKEN, SBX_ADDR) that can create and manage only its own child sandboxes")
	f.StringVar(&c.runtime, "runtime", "", "runtime driver (default: the daemon's)")
	f.StringVarP(&c.user, "user", "u", "", "default user of commands (default: the image's, else root)")
	f.BoolVar(&c.noEntrypoint, "no-entrypoint", false, "start neither the image's ENTRYPOINT nor its CMD (a given command then runs alone)")
	c.net.add(f, "network")
	f.StringArrayVarP(&c.volumes, "volume", "v", nil, "mount a volume NAME:/path[:ro] (repeatable)")
	c.guard.add(f)
	f.StringArrayVar(&c.codebases, "codebase", nil, "mount a codebase NAME[:/path[:PRESET]] in a copy-on-write layer (default path /workspace; PRESET guards it, e.g. agent-safe; more rules with --rule on the path; repeatable)")
}

func (c *createFlags) options(command []string) (sbx.CreateOptions, error) {
	if err := c.net.check("network"); err != nil {
		return sbx.CreateOptions{}, err
	}
	mem, err := parseSize(c.memory)
	if err != nil {
		return sbx.CreateOptions{}, fmt.Errorf("--memory: %w", err)
	}
	disk, err := parseSize(c.disk)
	if err != nil {
		return sbx.CreateOptions{}, fmt.Errorf("--disk: %w", err)
	}
	labels, err := parseKV("label", c.labels)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	env, err := parseEnv(c.env)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	secrets, err := parseKV("secret", c.secrets)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	vols, err := parseVolumeMounts(c.volumes)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	domainSecrets, err := parseSecretFor(c.secretFor)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	cbs, err := parseCodebaseMounts(c.codebases)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	guards, err := c.guard.policies(cbs)
	if err != nil {
		return sbx.CreateOptions{}, err
	}
	return sbx.CreateOptions{
		Image: c.image, Name: c.name, Labels: labels, Env: env, Secrets: secrets, Command: command,
		Workdir: c.workdir, MemoryBytes: mem, CPUs: c.cpus, Pids: c.pids, DiskBytes: disk,
		Timeout: c.timeout, IdleTimeout: c.idleTimeout, StopWhenIdle: c.stopWhenIdle, Runtime: c.runtime, User: c.user,
		ScopedToken: c.scopedToken, NoEntrypoint: c.noEntrypoint, AutoResume: c.autoResume,
		Network: c.net.policy(), Volumes: vols, DomainSecrets: domainSecrets, PathPolicies: guards, Codebases: cbs,
	}, nil
}

func newCreate(a *app) *cobra.Command {
	var cf createFlags
	cmd := &cobra.Command{
		Use:   "create [flags] [--] [CMD [ARG...]]",
		Short: "Create a sandbox and print its id",
		Long: "Create a sandbox and print its id. CMD (after the image's ENTRYPOINT), or with none the image's\n" +
			"ENTRYPOINT and CMD, runs in the background for the sandbox's life: read it with sbx logs and sbx wait.\n" +
			"A command that cannot start fails the create.",
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := cf.options(dropDashes(args))
			if err != nil {
				return err
			}
			if err := a.ensureImage(cmd.Context(), opts.Image); err != nil {
				return err
			}
			sb, err := a.client().Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, sb.ID)
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	cf.add(cmd)
	a.completeCreateFlags(cmd)
	return cmd
}

func newRun(a *app) *cobra.Command {
	var cf createFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "run [flags] [--] CMD [ARG...]",
		Short: "Create a sandbox, run a command in it, destroy it",
		Long: "Create a sandbox, run a command in it, destroy it. sbx's own flags go before CMD: everything\n" +
			"from CMD on is the command and its arguments (sbx run python3 -c 'print(1)').",
		Args: commandArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := cf.options(nil)
			if err != nil {
				return err
			}
			// The command run is the one given here, not the image's.
			opts.NoEntrypoint = true
			if err := a.ensureImage(cmd.Context(), opts.Image); err != nil {
				return err
			}
			c := a.client()
			sb, err := c.Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			defer func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 30*time.Second)
				defer cancel()
				if err := sb.Destroy(dctx); err != nil {
					fmt.Fprintln(a.stderr, "sbx: destroying", sb.ID+":", err)
				}
			}()
			return a.runExec(cmd.Context(), sb, ef, dropDashes(args))
		},
	}
	cmd.Flags().SetInterspersed(false)
	cf.add(cmd)
	a.completeCreateFlags(cmd)
	cmd.Flags().BoolVarP(&ef.interactive, "interactive", "i", false, "stream stdin to the command")
	cmd.Flags().BoolVarP(&ef.tty, "tty", "t", false, "allocate a pseudo-terminal")
	cmd.Flags().DurationVar(&ef.timeout, "exec-timeout", 0, "kill the command after this long")
	return cmd
}

func newLs(a *app) *cobra.Command {
	var lf listFlags
	var labels []string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"}, // `ps` with no argument too (ps.go)
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := a.client().List(cmd.Context(), labels...)
			if err != nil {
				return err
			}
			return printList(a, lf, list,
				func(sb *sbx.Sandbox) string { return sb.ID },
				func(sb *sbx.Sandbox) any { return protoJSON(sb.Info) },
				"ID\tNAME\tIMAGE\tSTATE\tCREATED\tLABELS",
				func(sb *sbx.Sandbox) []any {
					i := sb.Info
					return []any{i.GetId(), i.GetName(), i.GetImage(), protoEnumText(i.GetState()), ago(i.GetCreatedAtMs()), labelText(i.GetLabels())}
				})
		},
	}
	lf.add(cmd, "print ids only")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "label selector k=v, k!=v, k or !k (repeatable)")
	return cmd
}

func ago(ms int64) string {
	d := time.Since(time.UnixMilli(ms)).Round(time.Second)
	return d.String() + " ago"
}

func newNetwork(a *app) *cobra.Command {
	var nf netFlags
	cmd := &cobra.Command{
		Use:               "network ID|NAME --mode none|public|allow [--allow-cidr C] [--allow-domain D] [--deny-cidr C]",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Replace a running sandbox's network policy",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if nf.mode == "" {
				return fmt.Errorf("--mode is required")
			}
			if err := nf.check("mode"); err != nil {
				return err
			}
			sb, err := a.client().Lookup(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := sb.UpdateNetwork(cmd.Context(), *nf.policy()); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s\t%s\t%s\n", sb.ID, protoEnumText(sb.Info.GetNetwork().GetMode()), sb.Info.GetIpAddress())
			return nil
		},
	}
	nf.add(cmd.Flags(), "mode")
	return cmd
}

func newInspect(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "inspect ID|NAME...",
		ValidArgsFunction: a.completeSandboxes(-1),
		Short:             "Show sandboxes as JSON (with live stats)",
		Args:              cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := a.client()
			var out []any
			for _, ref := range args {
				sb, err := c.Get(cmd.Context(), ref)
				if err != nil {
					return err
				}
				out = append(out, protoJSON(sb.Info))
			}
			if len(out) == 1 {
				return writeJSON(a.stdout, out[0])
			}
			return writeJSON(a.stdout, out)
		},
	}
	cmd.Flags().Bool("json", true, "print JSON (the only format)")
	return cmd
}

// eachRef runs op on every ref, printing each one that succeeded and each
// failure; it fails with exit code 1 when any did.
func (a *app) eachRef(refs []string, op func(ref string) error) error {
	failed := 0
	for _, ref := range refs {
		if err := op(ref); err != nil {
			fmt.Fprintln(a.stderr, "sbx:", err)
			failed++
			continue
		}
		fmt.Fprintln(a.stdout, ref)
	}
	if failed > 0 {
		return &ExitError{Code: 1}
	}
	return nil
}

// forEach runs op on every named sandbox, reporting each failure.
func (a *app) forEach(ctx context.Context, refs []string, op func(*sbx.Sandbox) error) error {
	c := a.client()
	return a.eachRef(refs, func(ref string) error {
		sb, err := c.Get(ctx, ref)
		if err != nil {
			return err
		}
		return op(sb)
	})
}

func newRm(a *app) *cobra.Command {
	var sync bool
	cmd := &cobra.Command{
		Use:               "rm ID|NAME...",
		ValidArgsFunction: a.completeSandboxes(-1),
		Aliases:           []string{"destroy"}, // not kill: that signals processes (ps.go)
		Short:             "Destroy sandboxes",
		Args:              cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.forEach(cmd.Context(), args, func(sb *sbx.Sandbox) error {
				if sync {
					return sb.DestroySynced(cmd.Context())
				}
				return sb.Destroy(cmd.Context())
			})
		},
	}
	cmd.Flags().BoolVar(&sync, "sync", false, "sync codebase changes back first; a conflict keeps the sandbox")
	return cmd
}

func newStop(a *app) *cobra.Command {
	return &cobra.Command{
		Use:               "stop ID|NAME...",
		ValidArgsFunction: a.completeSandboxes(-1),
		Short:             "Freeze sandboxes (processes and files are kept)",
		Args:              cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.forEach(cmd.Context(), args, func(sb *sbx.Sandbox) error { return sb.Stop(cmd.Context()) })
		},
	}
}

func newStart(a *app) *cobra.Command {
	return &cobra.Command{
		Use:               "start ID|NAME...",
		ValidArgsFunction: a.completeSandboxes(-1),
		Aliases:           []string{"resume"},
		Short:             "Resume stopped sandboxes",
		Args:              cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.forEach(cmd.Context(), args, func(sb *sbx.Sandbox) error { return sb.Start(cmd.Context()) })
		},
	}
}

func newVersion(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Aliases: []string{"info"},
		Short:   "Print client and daemon versions and the daemon's runtimes (health, capabilities, default)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(a.stdout, "client: %s\n", clientVersion())
			v, err := a.client().Version(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "daemon: %s\n", v.GetVersion())
			for _, r := range v.GetRuntimes() {
				def := ""
				if r.GetIsDefault() {
					def = " (default)"
				}
				health := "healthy"
				if !r.GetHealthy() {
					health = "UNHEALTHY"
				}
				fmt.Fprintf(a.stdout, "runtime %s%s: %s: %s\n", r.GetName(), def, health, r.GetHealthDetail())
				fmt.Fprintf(a.stdout, "  capabilities: %s\n", strings.Join(r.GetCapabilities(), ", "))
			}
			return nil
		},
	}
}
