package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

type updateFlags struct {
	timeout, idleTimeout            time.Duration
	idleAction                      string
	labels, labelRm                 []string
	replaceLabels, autoResume, json bool
	memory                          string
	cpus                            float64
	pids                            int64
}

func newUpdate(a *app) *cobra.Command {
	var uf updateFlags
	cmd := &cobra.Command{
		Use:   "update ID|NAME [--timeout D] [--idle-timeout D] [--label K=V] [--label-rm K] [--memory M] [--cpus N] [--pids N] [--auto-resume]",
		Short: "Change a sandbox's lifetime, labels, limits or auto-resume",
		Long: `Change a running or stopped sandbox. Only the flags given change anything.

--timeout sets a new lifetime counted from now (E2B's setTimeout): the sandbox
is destroyed that long after this command, sooner or later than before (0: no
limit, where the daemon has no --max-timeout). Limits must fit the host's
bounds and the tenant's quotas, and the runtime must be able to change them.
Nothing changes if any part is refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := uf.options(cmd)
			if err != nil {
				return err
			}
			sb, err := a.client().Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := sb.Update(cmd.Context(), opts); err != nil {
				return err
			}
			if uf.json {
				return writeJSON(a.stdout, protoJSON(sb.Info))
			}
			fmt.Fprintln(a.stdout, updatedText(sb.Info))
			return nil
		},
	}
	uf.add(cmd)
	return cmd
}

func (uf *updateFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&uf.timeout, "timeout", 0, "new lifetime counted from now, e.g. 10m (0: none)")
	f.DurationVar(&uf.idleTimeout, "idle-timeout", 0, "new idle timeout (0: none)")
	f.StringVar(&uf.idleAction, "idle-action", "", "what the idle timeout does: stop or destroy")
	f.StringArrayVarP(&uf.labels, "label", "l", nil, "set label KEY=VALUE (repeatable)")
	f.StringArrayVar(&uf.labelRm, "label-rm", nil, "remove label KEY (repeatable)")
	f.BoolVar(&uf.replaceLabels, "replace-labels", false, "make the labels exactly the --label ones")
	f.StringVarP(&uf.memory, "memory", "m", "", "new memory limit, e.g. 1G")
	f.Float64Var(&uf.cpus, "cpus", 0, "new CPU limit, e.g. 1.5")
	f.Int64Var(&uf.pids, "pids", 0, "new process limit")
	f.BoolVar(&uf.autoResume, "auto-resume", false, "start the sandbox when it is used while stopped (--auto-resume=false turns it off)")
	f.BoolVar(&uf.json, "json", false, "print the updated sandbox as JSON")
}

// options turns the flags given on cmd into an update; flags not given
// change nothing.
func (uf *updateFlags) options(cmd *cobra.Command) (sbx.UpdateOptions, error) {
	f := cmd.Flags()
	var o sbx.UpdateOptions
	if f.Changed("timeout") {
		if uf.timeout < 0 {
			return o, fmt.Errorf("--timeout %s: must not be negative", uf.timeout)
		}
		o.Timeout = &uf.timeout
	}
	if f.Changed("idle-timeout") {
		if uf.idleTimeout < 0 {
			return o, fmt.Errorf("--idle-timeout %s: must not be negative", uf.idleTimeout)
		}
		o.IdleTimeout = &uf.idleTimeout
	}
	switch uf.idleAction {
	case "":
	case "stop", "destroy":
		o.StopWhenIdle = new(uf.idleAction == "stop")
	default:
		return o, fmt.Errorf("--idle-action %q: want stop or destroy", uf.idleAction)
	}
	labels, err := parseKV("label", uf.labels)
	if err != nil {
		return o, err
	}
	o.SetLabels, o.RemoveLabels, o.ReplaceLabels = labels, uf.labelRm, uf.replaceLabels
	if o.MemoryBytes, err = parseSize(uf.memory); err != nil {
		return o, fmt.Errorf("--memory: %w", err)
	}
	if f.Changed("memory") && o.MemoryBytes == 0 {
		return o, fmt.Errorf("--memory %q: must be positive", uf.memory)
	}
	if uf.cpus < 0 || (f.Changed("cpus") && uf.cpus == 0) {
		return o, fmt.Errorf("--cpus %v: must be positive", uf.cpus)
	}
	if uf.pids < 0 || (f.Changed("pids") && uf.pids == 0) {
		return o, fmt.Errorf("--pids %d: must be positive", uf.pids)
	}
	o.CPUs, o.Pids = uf.cpus, uf.pids
	if f.Changed("auto-resume") {
		o.AutoResume = &uf.autoResume
	}
	if o.Timeout == nil && o.IdleTimeout == nil && o.StopWhenIdle == nil && o.AutoResume == nil && !o.ReplaceLabels &&
		len(o.SetLabels)+len(o.RemoveLabels) == 0 && o.MemoryBytes == 0 && o.CPUs == 0 && o.Pids == 0 {
		return o, fmt.Errorf("nothing to update: give --timeout, --idle-timeout, --idle-action, --label, --label-rm, --replace-labels, --memory, --cpus, --pids or --auto-resume")
	}
	return o, nil
}

// updatedText is one line saying what the sandbox now has.
func updatedText(s *sbxv1.Sandbox) string {
	expires := "never"
	if s.GetExpiresAtMs() > 0 {
		expires = "in " + time.Until(time.UnixMilli(s.GetExpiresAtMs())).Round(time.Second).String()
	}
	r := s.GetResources()
	parts := []string{
		s.GetId(), protoEnumText(s.GetState()), "expires " + expires,
		fmt.Sprintf("memory %s", sandbox.FormatBytes(r.GetMemoryBytes())),
		fmt.Sprintf("cpus %g", float64(r.GetCpuMillis())/1000),
		fmt.Sprintf("pids %d", r.GetPids()),
	}
	if s.GetAutoResume() {
		parts = append(parts, "auto-resume")
	}
	if l := labelText(s.GetLabels()); l != "" {
		parts = append(parts, l)
	}
	return strings.Join(parts, "\t")
}
