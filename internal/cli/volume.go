package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// parseVolumeMounts parses -v NAME:/path[:ro|:rw] flags.
func parseVolumeMounts(specs []string) ([]sbx.VolumeMount, error) {
	var out []sbx.VolumeMount
	for _, s := range specs {
		parts := strings.Split(s, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("--volume %q: want NAME:/path[:ro]", s)
		}
		vm := sbx.VolumeMount{Volume: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				vm.ReadOnly = true
			case "rw":
			default:
				return nil, fmt.Errorf("--volume %q: mode must be ro or rw", s)
			}
		}
		out = append(out, vm)
	}
	return out, nil
}

func newVolume(a *app) *cobra.Command {
	cmd := &cobra.Command{Use: "volume", Short: "Manage named persistent volumes"}
	var size string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := parseSize(size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			v, err := a.client().CreateVolume(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, v.GetName())
			return nil
		},
	}
	create.Flags().StringVar(&size, "size", "1G", "size quota, e.g. 1G")
	var lf listFlags
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List volumes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := a.client().ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			return printList(a, lf, vs,
				func(v *sbxv1.Volume) string { return v.GetName() },
				func(v *sbxv1.Volume) any { return protoJSON(v) },
				"NAME\tSIZE\tUSED\tCREATED\tSANDBOXES",
				func(v *sbxv1.Volume) []any {
					return []any{v.GetName(), sandbox.FormatBytes(v.GetSizeBytes()), sandbox.FormatBytes(v.GetUsedBytes()),
						ago(v.GetCreatedAtMs()), strings.Join(v.GetSandboxes(), ",")}
				})
		},
	}
	lf.add(ls, "print names only")
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove volumes and their data",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range args {
				if err := a.client().RemoveVolume(cmd.Context(), n); err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, n)
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
