package cli

import (
	"bytes"
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

func newBuild(a *app) *cobra.Command {
	var file, tag, contextDir string
	var buildArgs []string
	var noCache, quiet bool
	cmd := &cobra.Command{
		Use:   "build -f RECIPE.yaml|Dockerfile -t REF [CONTEXT_DIR] [--no-cache]",
		Short: "Build an image from a recipe or a Dockerfile, one sandbox per step, caching unchanged steps",
		Long: `Build an image from a recipe or a Dockerfile, one sandbox per step, caching unchanged steps.

A file whose name ends in .yaml, .yml or .json is a recipe; anything else
(Dockerfile, app.Dockerfile, Dockerfile.dev) is a Dockerfile. Dockerfiles
support FROM, RUN, COPY, ADD (local files), ENV, ARG (--build-arg),
WORKDIR, USER, ENTRYPOINT and CMD; LABEL, EXPOSE, MAINTAINER and STOPSIGNAL
are accepted; anything else fails naming its line. Their build context
(the CONTEXT_DIR argument, else --context, else the Dockerfile's
directory) is sent to the daemon as a tar, without what its .dockerignore
lists, at most 48 MiB; symlinks in it are sent as links, never followed.

Copy steps read only the build context: the recipe file's directory, or
the directory --context names. A copy's src must be a relative path inside
it (no absolute paths, no ".." components). Symlinks are never followed:
one pointing inside what is copied is copied as a link, one pointing out of
it is refused, as is a src that leads out of the context through one. The
recipe is treated as untrusted: it cannot read other host files.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" || tag == "" {
				return fmt.Errorf("build: give a recipe or Dockerfile with -f and a name with -t")
			}
			if len(args) == 1 {
				if contextDir != "" && contextDir != args[0] {
					return fmt.Errorf("build: the context is given twice (%s and --context %s)", args[0], contextDir)
				}
				contextDir = args[0]
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
			if isDockerfile(file) {
				return a.buildDockerfile(cmd.Context(), string(data), contextDir, buildArgs, tag, noCache, quiet)
			}
			if len(buildArgs) > 0 {
				return fmt.Errorf("build: --build-arg goes with a Dockerfile, not a recipe")
			}
			recipe, err := parseRecipe(data, contextDir)
			if err != nil {
				return err
			}
			p := &buildProgress{w: a.stderr, quiet: quiet, steps: len(recipe.GetSteps()), start: time.Now()}
			img, err := a.client().Images().Build(cmd.Context(), recipe, tag, noCache, p.event)
			return p.done(a.stdout, img, err)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "recipe (.yaml, .yml, .json) or Dockerfile")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "NAME=value for a Dockerfile ARG (repeatable)")
	f.StringVarP(&tag, "tag", "t", "", "reference to give the built image")
	f.StringVar(&contextDir, "context", "", "build context: the only directory copy steps read (default: the file's directory)")
	f.BoolVar(&noCache, "no-cache", false, "rerun every step")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

// isDockerfile tells a Dockerfile from a recipe by the file's name.
func isDockerfile(file string) bool {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".yaml", ".yml", ".json":
		return false
	}
	return true
}

// buildDockerfile sends a Dockerfile and its packed context to the daemon.
func (a *app) buildDockerfile(ctx context.Context, dockerfile, contextDir string, buildArgs []string, tag string, noCache, quiet bool) error {
	args := map[string]string{}
	for _, kv := range buildArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("build: --build-arg %q: want NAME=value", kv)
		}
		args[k] = v
	}
	p := &buildProgress{w: a.stderr, quiet: quiet, start: time.Now()}
	img, err := a.client().Images().BuildDockerfile(ctx, dockerfile, contextDir, sbx.DockerfileOptions{
		Tag: tag, BuildArgs: args, NoCache: noCache, Progress: p.event})
	return p.done(a.stdout, img, err)
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
		if p.steps == 0 { // a Dockerfile's: the daemon counts them
			pos = fmt.Sprintf("[%d]", s.GetIndex())
		}
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

// done ends the progress display of a build that returned img and err,
// says how long it took, and prints the image's ref and digest to out.
func (p *buildProgress) done(out io.Writer, img *sbxv1.ImageInfo, err error) error {
	p.endLine()
	if err != nil {
		return err
	}
	if !p.quiet {
		fmt.Fprintf(p.w, "built in %s\n", fmtDuration(time.Since(p.start)))
	}
	fmt.Fprintf(out, "%s %s\n", img.GetRef(), img.GetDigest())
	return nil
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
