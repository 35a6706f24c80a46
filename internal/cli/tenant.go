package cli

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

func newTenant(a *app) *cobra.Command {
	show := func(cmd *cobra.Command, args []string) error {
		var t *sbxv1.Tenant
		var err error
		if len(args) == 1 {
			t, err = a.client().GetTenant(cmd.Context(), args[0])
		} else {
			t, err = a.client().Tenant(cmd.Context())
		}
		if err != nil {
			return err
		}
		return printTenant(a.stdout, t)
	}
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Your tenant's quotas and usage; tenants of a multi-tenant daemon (sbx serve --tenants)",
		Args:  cobra.NoArgs,
		RunE:  show,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "show [NAME]",
		Short: "Show a tenant's quotas and what it uses (NAME: with the daemon's admin token)",
		Args:  cobra.MaximumNArgs(1),
		RunE:  show,
	})
	var lf listFlags
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List every tenant with its usage and quotas (the daemon's admin token only)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := a.client().ListTenants(cmd.Context())
			if err != nil {
				return err
			}
			return printList(a, lf, ts,
				func(t *sbxv1.Tenant) string { return t.GetName() },
				func(t *sbxv1.Tenant) any { return protoJSON(t) },
				"NAME\tSANDBOXES\tMEMORY\tCPU\tDISK\tSTORAGE\tTOKENS",
				func(t *sbxv1.Tenant) []any {
					u, q := t.GetUsage(), t.GetQuotas()
					return []any{t.GetName(),
						usedOf(fmt.Sprint(u.GetSandboxes()), int64(q.GetMaxSandboxes()), fmt.Sprint(q.GetMaxSandboxes())),
						usedOf(sandbox.FormatBytes(u.GetMemoryBytes()), q.GetMemoryBytes(), sandbox.FormatBytes(q.GetMemoryBytes())),
						usedOf(millis(u.GetCpuMillis()), q.GetCpuMillis(), millis(q.GetCpuMillis())),
						usedOf(sandbox.FormatBytes(u.GetDiskBytes()), q.GetDiskBytes(), sandbox.FormatBytes(q.GetDiskBytes())),
						usedOf(sandbox.FormatBytes(u.GetStorageBytes()), q.GetStorageBytes(), sandbox.FormatBytes(q.GetStorageBytes())),
						t.GetTokens()}
				})
		},
	}
	lf.add(ls, "print names only")
	cmd.AddCommand(ls)
	cmd.AddCommand(&cobra.Command{
		Use:   "hash-token [TOKEN]",
		Short: "Print a token's hash for the tenants file (without TOKEN: make a new token and print both)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 1 {
				if len(args[0]) < 16 {
					return fmt.Errorf("token is shorter than 16 characters: use a long random one (or run without TOKEN to make one)")
				}
				fmt.Fprintln(a.stdout, tenant.HashToken(args[0]))
				return nil
			}
			tok := tenant.NewToken()
			fmt.Fprintf(a.stdout, "token: %s\nhash:  %s\n", tok, tenant.HashToken(tok))
			return nil
		},
	})
	return cmd
}

// usedOf is "used / quota", or "used" alone for an unlimited quota (0).
func usedOf(used string, quota int64, quotaText string) string {
	if quota == 0 {
		return used
	}
	return used + " / " + quotaText
}

func millis(m int64) string { return fmt.Sprintf("%dm", m) }

// printTenant shows a tenant's usage against its quotas.
func printTenant(w io.Writer, t *sbxv1.Tenant) error {
	name := t.GetName()
	if name == "" {
		name = "(single-user daemon: no tenants, no quotas)"
	}
	fmt.Fprintf(w, "tenant: %s\n", name)
	if s := t.GetScopeSandbox(); s != "" {
		fmt.Fprintf(w, "scoped token of sandbox %s (manages its children only)\n", s)
	}
	u, q := t.GetUsage(), t.GetQuotas()
	quota := func(v int64, text string) string {
		if v == 0 {
			return "unlimited"
		}
		return text
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tUSED\tQUOTA")
	fmt.Fprintf(tw, "sandboxes\t%d\t%s\n", u.GetSandboxes(), quota(int64(q.GetMaxSandboxes()), fmt.Sprint(q.GetMaxSandboxes())))
	fmt.Fprintf(tw, "memory\t%s\t%s\n", sandbox.FormatBytes(u.GetMemoryBytes()), quota(q.GetMemoryBytes(), sandbox.FormatBytes(q.GetMemoryBytes())))
	fmt.Fprintf(tw, "cpu\t%s\t%s\n", millis(u.GetCpuMillis()), quota(q.GetCpuMillis(), millis(q.GetCpuMillis())))
	fmt.Fprintf(tw, "disk\t%s\t%s\n", sandbox.FormatBytes(u.GetDiskBytes()), quota(q.GetDiskBytes(), sandbox.FormatBytes(q.GetDiskBytes())))
	fmt.Fprintf(tw, "storage\t%s\t%s\n", sandbox.FormatBytes(u.GetStorageBytes()), quota(q.GetStorageBytes(), sandbox.FormatBytes(q.GetStorageBytes())))
	fmt.Fprintf(tw, "  images\t%s\n", sandbox.FormatBytes(u.GetImagesBytes()))
	fmt.Fprintf(tw, "  volumes\t%s\n", sandbox.FormatBytes(u.GetVolumesBytes()))
	fmt.Fprintf(tw, "  codebases\t%s\n", sandbox.FormatBytes(u.GetCodebasesBytes()))
	return tw.Flush()
}
