package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newSnapshot(a *app) *cobra.Command {
	var tag string
	cmd := &cobra.Command{
		Use:               "snapshot ID|NAME -t REF",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Make an image of a sandbox's filesystem (its image plus its changes)",
		Args:              cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tag == "" {
				return fmt.Errorf("snapshot: give the new image a name with -t")
			}
			c := a.client()
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			img, err := sb.Snapshot(cmd.Context(), tag)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s %s\n", img.GetRef(), img.GetDigest())
			return nil
		},
	}
	cmd.Flags().StringVarP(&tag, "tag", "t", "", "reference to give the new image (required)")
	return cmd
}
