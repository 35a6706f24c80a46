package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func newBuild(a *app) *cobra.Command {
	var file, tag, contextDir string
	var noCache, quiet bool
	cmd := &cobra.Command{
		Use:   "build -f RECIPE.yaml -t REF [--context DIR] [--no-cache]",
		Short: "Build an image from a recipe, one sandbox per step, caching unchanged steps",
		Long: `Build an image from a recipe, one sandbox per step, caching unchanged steps.

Copy steps read only the build context: the recipe file's directory, or
the directory --context names. A copy's src must be a relative path inside
it (no absolute paths, no ".." components). Symlinks are never followed:
one pointing inside what is copied is copied as a link, one pointing out of
it is refused, as is a src that leads out of the context through one. The
recipe is treated as untrusted: it cannot read other host files.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" || tag == "" {
				return fmt.Errorf("build: give a recipe with -f and a name with -t")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if contextDir == "" {
				abs, err := filepath.Abs(file)
				if err != nil {
					return err
				}
				contextDir = filepath.Dir(abs)
			}
			recipe, err := parseRecipe(data, contextDir)
			if err != nil {
				return err
			}
			p := &buildProgress{w: a.stderr, quiet: quiet, steps: len(recipe.GetSteps()), start: time.Now()}
			img, err := a.client().Images().Build(cmd.Context(), recipe, tag, noCache, p.event)
			p.endLine()
			if err != nil {
				return err
			}
			if !quiet {
				fmt.Fprintf(a.stderr, "built in %s\n", fmtDuration(time.Since(p.start)))
			}
			fmt.Fprintf(a.stdout, "%s %s\n", img.GetRef(), img.GetDigest())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "recipe (YAML)")
	f.StringVarP(&tag, "tag", "t", "", "reference to give the built image")
	f.StringVar(&contextDir, "context", "", "build context: the only directory copy steps read (default: the recipe's directory)")
	f.BoolVar(&noCache, "no-cache", false, "rerun every step")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

// buildProgress prints one line per step phase and the step's output
// indented under it:
//
//	[1/3] CACHED RUN make deps
//	[2/3] RUN make
//	      cc -o app main.c
//	[2/3] done in 1.2s
type buildProgress struct {
	w      io.Writer
	quiet  bool
	steps  int
	start  time.Time
	midLog bool // the last log chunk did not end a line
}

func (p *buildProgress) event(ev *sbxv1.ImageProgress) {
	if p.quiet {
		return
	}
	switch e := ev.GetEvent().(type) {
	case *sbxv1.ImageProgress_Status:
		p.endLine()
		fmt.Fprintln(p.w, e.Status)
	case *sbxv1.ImageProgress_Step:
		p.endLine()
		s := e.Step
		pos := fmt.Sprintf("[%d/%d]", s.GetIndex(), p.steps)
		switch s.GetPhase() {
		case "cached":
			fmt.Fprintf(p.w, "%s CACHED %s\n", pos, s.GetDescription())
		case "running":
			fmt.Fprintf(p.w, "%s %s\n", pos, s.GetDescription())
		case "done":
			fmt.Fprintf(p.w, "%s done in %s\n", pos, fmtDuration(time.Duration(s.GetDurationMs())*time.Millisecond))
		default:
			fmt.Fprintf(p.w, "%s %s %s\n", pos, s.GetPhase(), s.GetDescription())
		}
	case *sbxv1.ImageProgress_Log:
		p.log(e.Log)
	}
}

// log writes output indented, line by line, across chunk boundaries.
func (p *buildProgress) log(b []byte) {
	for len(b) > 0 {
		if !p.midLog {
			io.WriteString(p.w, "      ")
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.w.Write(b)
			p.midLog = true
			return
		}
		p.w.Write(b[:i+1])
		p.midLog = false
		b = b[i+1:]
	}
}

func (p *buildProgress) endLine() {
	if p.midLog {
		io.WriteString(p.w, "\n")
		p.midLog = false
	}
}

func fmtDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
