package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/sandbox"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newPull(a *app) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from a registry (auth from ~/.docker/config.json)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := newProgress(a.stderr, quiet)
			img, err := a.client().Images().Pull(cmd.Context(), args[0], p.event)
			p.finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%s %s\n", img.GetRef(), img.GetDigest())
			return nil
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

// progress prints per-layer pull progress, one line per layer update at
// most every 200ms.
type progress struct {
	w     io.Writer
	quiet bool
	last  time.Time
}

func newProgress(w io.Writer, quiet bool) *progress { return &progress{w: w, quiet: quiet} }

func (p *progress) event(ev *sbxv1.ImageProgress) {
	if p.quiet {
		return
	}
	switch e := ev.GetEvent().(type) {
	case *sbxv1.ImageProgress_Status:
		fmt.Fprintln(p.w, e.Status)
	case *sbxv1.ImageProgress_Layer:
		l := e.Layer
		short := strings.TrimPrefix(l.GetDigest(), "sha256:")
		if len(short) > 12 {
			short = short[:12]
		}
		if l.GetPhase() == "fetching" && time.Since(p.last) < 200*time.Millisecond {
			return
		}
		p.last = time.Now()
		fmt.Fprintf(p.w, "  %s %-8s %s / %s\n", short, l.GetPhase(), sandbox.FormatBytes(l.GetCurrentBytes()), sandbox.FormatBytes(l.GetTotalBytes()))
	}
}

func (p *progress) finish() {}

// ensureImage pulls a create's image first when the daemon does not have
// it, showing the pull's progress on stderr (the create would pull it
// anyway, silently).
func (a *app) ensureImage(ctx context.Context, ref string) error {
	p := newProgress(a.stderr, false)
	_, err := a.client().Images().Ensure(ctx, ref, p.event)
	p.finish()
	return err
}

func newImages(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Manage images (ls, import, export, tag, rm, prune)",
	}
	var lf listFlags
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			imgs, total, err := a.client().Images().List(cmd.Context())
			if err != nil {
				return err
			}
			err = printList(a, lf, imgs,
				func(i *sbxv1.ImageInfo) string { return i.GetRef() },
				func(i *sbxv1.ImageInfo) any { return protoJSON(i) },
				"REF\tDIGEST\tLAYERS\tSIZE",
				func(i *sbxv1.ImageInfo) []any {
					d := strings.TrimPrefix(i.GetDigest(), "sha256:")
					if len(d) > 12 {
						d = d[:12]
					}
					return []any{i.GetRef(), d, i.GetLayers(), sandbox.FormatBytes(i.GetSizeBytes())}
				})
			if err != nil || lf.json || lf.quiet {
				return err
			}
			fmt.Fprintf(a.stdout, "\nlayers on disk: %s\n", sandbox.FormatBytes(total))
			return nil
		},
	}
	lf.add(ls, "print references only")
	var impOpts sbx.ImportOptions
	imp := &cobra.Command{
		Use:   "import FILE|-",
		Short: "Import a docker-save or OCI-layout tarball",
		Long: `Import a docker-save or OCI-layout tarball.

The image is named by --tag only. The names inside the archive (docker-save
RepoTags, OCI layout annotations) were chosen by whoever made it, so they
are listed but not applied unless --use-archive-tags is given; then each
must be a valid image reference, and one that already names another image
fails the import unless --replace-archive-tags is given too.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = a.stdin
			var size int64
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
				if fi, err := f.Stat(); err == nil {
					size = fi.Size()
				}
			}
			p := a.newTransfer("importing "+args[0], size)
			resp, err := a.client().Images().ImportWith(cmd.Context(), p.reader(r), impOpts)
			p.done()
			if err != nil {
				return err
			}
			names := resp.GetArchiveNames()
			for i, img := range resp.GetImages() {
				fmt.Fprintf(a.stdout, "%s %s\n", img.GetRef(), img.GetDigest())
				if i >= len(names) {
					continue
				}
				if t := names[i].GetTags(); len(t) > 0 && !impOpts.UseArchiveTags {
					fmt.Fprintf(a.stderr, "  archive names it %s (not applied; see --use-archive-tags)\n", strings.Join(t, ", "))
				}
				if bad := names[i].GetRejected(); len(bad) > 0 {
					fmt.Fprintf(a.stderr, "  archive names it %s: not valid image references, ignored\n", strings.Join(bad, ", "))
				}
			}
			return nil
		},
	}
	imp.Flags().StringVarP(&impOpts.Tag, "tag", "t", "", "reference to give the imported image (moved here if it names another image)")
	imp.Flags().BoolVar(&impOpts.UseArchiveTags, "use-archive-tags", false, "also apply the names inside the archive (each checked; an existing name is not moved)")
	imp.Flags().BoolVar(&impOpts.ReplaceArchiveTags, "replace-archive-tags", false, "with --use-archive-tags: move names that already name another image")
	var output string
	exp := &cobra.Command{
		Use:   "export REF",
		Short: "Export an image as a docker-save tarball",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output == "" || output == "-" {
				p := a.newTransfer("exporting "+args[0], 0)
				defer p.done()
				return a.client().Images().Export(cmd.Context(), args[0], p.writer(a.stdout))
			}
			tmp, err := os.CreateTemp(".", ".sbx-export-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			p := a.newTransfer("exporting "+args[0]+" to "+output, 0)
			err = a.client().Images().Export(cmd.Context(), args[0], p.writer(tmp))
			p.done()
			if err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			return os.Rename(tmp.Name(), output)
		},
	}
	exp.Flags().StringVarP(&output, "output", "o", "", "file to write (default: stdout)")
	tagCmd := &cobra.Command{
		Use:   "tag SOURCE TARGET",
		Short: "Give an image another reference",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.client().Images().Tag(cmd.Context(), args[0], args[1])
		},
	}
	rm := &cobra.Command{
		Use:   "rm REF...",
		Short: "Remove images (their layers go at the next prune)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			images := a.client().Images()
			return a.eachRef(args, func(ref string) error { return images.Remove(cmd.Context(), ref) })
		},
	}
	prune := &cobra.Command{
		Use:   "prune",
		Short: "Delete layers no image or sandbox uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			freed, err := a.client().Images().Prune(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "freed %s\n", sandbox.FormatBytes(freed))
			return nil
		},
	}
	cmd.AddCommand(ls, imp, exp, tagCmd, rm, prune)
	return cmd
}
