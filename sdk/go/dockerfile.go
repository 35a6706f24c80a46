package sbx

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// MaxContextBytes bounds a Dockerfile build's context tar (the daemon
// refuses more).
const MaxContextBytes = 48 << 20

// DockerfileOptions are the options of BuildDockerfile.
type DockerfileOptions struct {
	// Tag names the built image.
	Tag string
	// BuildArgs set the Dockerfile's ARGs.
	BuildArgs map[string]string
	// NoCache reruns every step.
	NoCache bool
	// Progress (may be nil) sees every event, as for Build.
	Progress func(*sbxv1.ImageProgress)
}

// BuildDockerfile builds a Dockerfile (its text) with the directory
// contextDir as its build context ("" for none), packed by PackContext.
// The daemon maps the Dockerfile's instructions onto recipe steps (see
// BuildImageRequest.dockerfile for what is supported); an unsupported one
// fails with InvalidArgument naming its line.
func (im *Images) BuildDockerfile(ctx context.Context, dockerfile string, contextDir string, opts DockerfileOptions) (*sbxv1.ImageInfo, error) {
	var tarball []byte
	if contextDir != "" {
		var err error
		if tarball, err = PackContext(contextDir); err != nil {
			return nil, err
		}
	}
	req := &sbxv1.BuildImageRequest{Dockerfile: dockerfile, Context: tarball, BuildArgs: opts.BuildArgs, Tag: opts.Tag, NoCache: opts.NoCache}
	stream, err := im.api.BuildImage(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrap("build", err)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg()
		if opts.Progress != nil {
			opts.Progress(ev)
		}
		if done := ev.GetDone(); done != nil {
			return done, nil
		}
	}
	return nil, wrap("build", endedEarly(stream.Err()))
}

// PackContext tars the directory dir as a Dockerfile build context,
// leaving out what dir/.dockerignore lists. It reads dir through an
// os.Root: no name resolves outside it, symlinks are archived as links and
// never followed (and a file is read only if it is still the one the walk
// saw); only directories, regular files and symlinks are packed.
// A context over MaxContextBytes is an error naming the size.
func PackContext(dir string) ([]byte, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open build context: %w", err)
	}
	defer root.Close()
	ign, err := readDockerignore(root)
	if err != nil {
		return nil, err
	}
	fsys := root.FS().(fs.ReadLinkFS)
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	buf := make([]byte, 256<<10)
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if ign.excluded(p) {
			if d.IsDir() && !ign.negations {
				return fs.SkipDir
			}
			return nil
		}
		fi, err := fsys.Lstat(p)
		if err != nil {
			return err
		}
		var link string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = fsys.ReadLink(p); err != nil {
				return err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = p, 0, 0, "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if int64(out.Len())+hdr.Size+1024 > MaxContextBytes {
			return fmt.Errorf("build context %s is more than %d bytes (at %s): list what the build does not need in .dockerignore", dir, MaxContextBytes, p)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		// The very file walked: one swapped for a link since (to a file
		// .dockerignore leaves out, say) is not read in its place.
		return copyFile(tw, root, LocalFile{Rel: p, Info: fi}, buf)
	})
	if err != nil {
		return nil, fmt.Errorf("pack build context: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// dockerignore holds .dockerignore rules (docker's semantics): patterns
// are relative to the context root (a leading "/" is dropped), "*" and "?"
// do not cross "/", "**" matches any number of directories, "!" re-includes,
// the last matching rule wins, and a rule matching a directory matches
// everything in it.
type dockerignore struct {
	rules     []ignoreRuleD
	negations bool // some rule re-includes: excluded dirs are still walked
}

type ignoreRuleD struct {
	re     *regexp.Regexp
	negate bool
}

func readDockerignore(root *os.Root) (*dockerignore, error) {
	di := &dockerignore{}
	// Never followed, a regular file, bounded (readIgnoreFile).
	data, err := readIgnoreFile(root, ".dockerignore")
	if err != nil || data == nil {
		return di, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRuleD{}
		if strings.HasPrefix(line, "!") {
			r.negate, di.negations = true, true
			line = strings.TrimSpace(line[1:])
		}
		p := path.Clean(strings.TrimPrefix(line, "/"))
		re, err := regexp.Compile("^" + dockerignoreRegexp(p) + "$")
		if err != nil {
			return nil, fmt.Errorf(".dockerignore line %d: %q: %w", n, line, err)
		}
		r.re = re
		di.rules = append(di.rules, r)
	}
	return di, sc.Err()
}

func dockerignoreRegexp(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case strings.HasPrefix(p[i:], "**/"):
			b.WriteString("(.*/)?")
			i += 2
		case strings.HasPrefix(p[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			if j := strings.IndexByte(p[i:], ']'); j > 0 {
				class := p[i+1 : i+j]
				if strings.HasPrefix(class, "!") {
					class = "^" + class[1:]
				}
				b.WriteString("[" + class + "]")
				i += j
				continue
			}
			b.WriteString(`\[`)
		case c == '\\' && i+1 < len(p):
			i++
			b.WriteString(regexp.QuoteMeta(p[i : i+1]))
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	return b.String()
}

// excluded reports whether the context path p (slash-separated) is left
// out: the last rule matching p or one of its parent directories decides.
func (di *dockerignore) excluded(p string) bool {
	out := false
	for _, r := range di.rules {
		for q := p; q != "." && q != ""; q = path.Dir(q) {
			if r.re.MatchString(q) {
				out = !r.negate
				break
			}
		}
	}
	return out
}
