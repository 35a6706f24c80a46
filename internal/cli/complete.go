package cli

import (
	"strings"

	"github.com/spf13/cobra"
)

// completeSandboxes completes the first n arguments (n < 0: every one) with
// the ids and names of the daemon's sandboxes, each described by its state
// and image. Later arguments (a command, a path) complete as files.
func (a *app) completeSandboxes(n int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if n >= 0 && len(args) >= n {
			return nil, cobra.ShellCompDirectiveDefault
		}
		return a.sandboxCompletions(cmd, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
}

// sandboxCompletions lists "ref<suffix>" for each sandbox id and name
// starting with prefix (none when the daemon cannot be reached: completion
// must not print errors into the shell).
func (a *app) sandboxCompletions(cmd *cobra.Command, prefix, suffix string) []cobra.Completion {
	list, err := a.client().List(cmd.Context())
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, sb := range list {
		i := sb.Info
		desc := protoEnumText(i.GetState()) + " " + i.GetImage()
		for _, ref := range []string{i.GetId(), i.GetName()} {
			if ref != "" && strings.HasPrefix(ref, prefix) {
				out = append(out, cobra.CompletionWithDesc(ref+suffix, desc))
			}
		}
	}
	return out
}

// completeCp completes SRC and DST of cp: a sandbox reference followed by
// ":" before the path, or a local file.
func (a *app) completeCp(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) >= 2 || strings.Contains(toComplete, ":") || strings.HasPrefix(toComplete, "/") || strings.HasPrefix(toComplete, ".") {
		return nil, cobra.ShellCompDirectiveDefault
	}
	return a.sandboxCompletions(cmd, toComplete, ":"), cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveDefault
}

// completeCreateFlags completes --image with the daemon's image references,
// --volume with volume names and --codebase with codebase names (each
// followed by ":" for the mount path).
func (a *app) completeCreateFlags(cmd *cobra.Command) {
	reg := func(flag string, list func(cmd *cobra.Command) []string, suffix string) {
		_ = cmd.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			var out []cobra.Completion
			for _, n := range list(cmd) {
				if n != "" && strings.HasPrefix(n, toComplete) {
					out = append(out, n+suffix)
				}
			}
			d := cobra.ShellCompDirectiveNoFileComp
			if suffix != "" {
				d |= cobra.ShellCompDirectiveNoSpace
			}
			return out, d
		})
	}
	reg("image", func(cmd *cobra.Command) []string {
		imgs, _, err := a.client().Images().List(cmd.Context())
		if err != nil {
			return nil
		}
		var out []string
		for _, i := range imgs {
			out = append(out, i.GetRef())
		}
		return out
	}, "")
	reg("volume", func(cmd *cobra.Command) []string {
		vs, err := a.client().ListVolumes(cmd.Context())
		if err != nil {
			return nil
		}
		var out []string
		for _, v := range vs {
			out = append(out, v.GetName())
		}
		return out
	}, ":")
	reg("codebase", func(cmd *cobra.Command) []string {
		cbs, err := a.client().ListCodebases(cmd.Context())
		if err != nil {
			return nil
		}
		var out []string
		for _, cb := range cbs {
			out = append(out, cb.GetName(), cb.GetId())
		}
		return out
	}, ":")
}
