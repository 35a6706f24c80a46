package sbx

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// CodebaseMount mounts a codebase (id or name) at Path ("" = /workspace) in
// a sandbox, in a copy-on-write layer of the sandbox's own.
type CodebaseMount struct {
	Codebase string
	Path     string
	// Preset, Rules and Default, if any is set, guard the mount with
	// permission rules (a PathPolicy at Path; see PathPolicy).
	Preset  string
	Rules   []PermissionRule
	Default Permission
}

// GuardedDefaultPreset is the preset of a guarded codebase mount (one with
// Rules) that names neither a Preset nor a Default: view-only, so that its
// rules open what the sandbox may read or write (AgentFense's default; the
// daemon alone would start such a guard from write). A mount with none of
// the three is unguarded: fully writable in its copy-on-write layer.
const GuardedDefaultPreset = "view-only"

// Proto converts the mount to its API message.
func (m CodebaseMount) Proto() *sbxv1.CodebaseMount {
	if len(m.Rules) > 0 && m.Preset == "" && m.Default == sbxv1.Permission_PERMISSION_UNSPECIFIED {
		m.Preset = GuardedDefaultPreset
	}
	pp := PathPolicy{Path: m.Path, Preset: m.Preset, Rules: m.Rules, Default: m.Default}.Proto()
	return &sbxv1.CodebaseMount{Codebase: m.Codebase, Path: m.Path, Preset: pp.Preset, Rules: pp.Rules, DefaultPermission: pp.DefaultPermission}
}

// DefaultMaxFileBytes is the per-file size limit of uploads unless told.
const DefaultMaxFileBytes = 10 << 20

// UploadOptions tune CreateCodebase.
type UploadOptions struct {
	// Name is an optional unique name.
	Name string
	// Ignore adds gitignore-style patterns, anchored at the directory and
	// winning over .gitignore and .sandboxignore files.
	Ignore []string
	// MaxFileBytes: larger files are skipped and reported (0: 10 MiB;
	// negative: no limit).
	MaxFileBytes int64
	// NoGit leaves the .git directory out (it is uploaded by default, so
	// that git works in the sandbox).
	NoGit bool
	// NoIgnoreFiles disregards .gitignore and .sandboxignore files.
	NoIgnoreFiles bool
	// Progress, if set, is called as the upload goes with the bytes sent
	// so far (tar headers included) and the total size of the files.
	Progress func(sent, total int64)
}

// LocalFile is one file an upload walk selected.
type LocalFile struct {
	// Rel is slash-separated, relative to the walked directory.
	Rel  string
	Info fs.FileInfo
}

// WalkCodebase lists what CreateCodebase would upload from dir (parents
// before children) and what it would skip.
func WalkCodebase(dir string, opts UploadOptions) ([]LocalFile, []*sbxv1.SkippedFile, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("codebase directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("codebase directory %s: not a directory", dir)
	}
	maxFile := opts.MaxFileBytes
	if maxFile == 0 {
		maxFile = DefaultMaxFileBytes
	}
	root := &ignoreMatcher{}
	for _, p := range opts.Ignore {
		r, ok, err := compileIgnore(p, "")
		if err != nil {
			return nil, nil, err
		}
		if ok {
			root.extra = append(root.extra, r)
		}
	}
	// The directory may be shaped by someone else (a cloned repository, a
	// tree a sandbox shares): it is read through an os.Root, so a directory
	// swapped for a symlink during the walk cannot make it list (and
	// writeCodebaseTar read) anything outside dir.
	tree, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("codebase directory: %w", err)
	}
	defer tree.Close()
	fsys := tree.FS()
	var files []LocalFile
	var skipped []*sbxv1.SkippedFile
	var walk func(rel string, m *ignoreMatcher) error
	walk = func(rel string, m *ignoreMatcher) error {
		if !opts.NoIgnoreFiles {
			var err error
			if m, err = m.child(tree, rel); err != nil {
				return err
			}
		}
		name := rel
		if name == "" {
			name = "."
		}
		ents, err := fs.ReadDir(fsys, name)
		if err != nil {
			return fmt.Errorf("read directory %s: %w", filepath.Join(dir, filepath.FromSlash(rel)), err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			r := e.Name()
			if rel != "" {
				r = rel + "/" + r
			}
			isDir := e.IsDir()
			if r == ".git" && isDir && opts.NoGit {
				continue
			}
			if m.ignored(r, isDir) {
				continue
			}
			info, err := e.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue // vanished during the walk
				}
				return fmt.Errorf("stat %s: %w", r, err)
			}
			switch mode := info.Mode(); {
			case mode.IsDir():
				files = append(files, LocalFile{Rel: r, Info: info})
				if err := walk(r, m); err != nil {
					return err
				}
			case mode.IsRegular():
				if maxFile > 0 && info.Size() > maxFile {
					skipped = append(skipped, &sbxv1.SkippedFile{Path: r, SizeBytes: info.Size(), Reason: fmt.Sprintf("larger than %d bytes", maxFile)})
					continue
				}
				files = append(files, LocalFile{Rel: r, Info: info})
			case mode&fs.ModeSymlink != 0:
				files = append(files, LocalFile{Rel: r, Info: info})
			default:
				skipped = append(skipped, &sbxv1.SkippedFile{Path: r, Reason: "not a regular file, directory or symlink"})
			}
		}
		return nil
	}
	if err := walk("", root); err != nil {
		return nil, nil, err
	}
	return files, skipped, nil
}

// writeCodebaseTar writes files (from WalkCodebase) of dir as a tar owned
// by root. Files that changed size since the walk are written as walked
// (truncated or zero-padded would corrupt them: such a file fails the upload).
// Each regular file is opened through an os.Root of dir without following
// a final symlink and must be the very file the walk saw (same device and
// inode): one swapped for a link (or reached through a directory swapped
// for one) since the walk fails the upload instead of sending what the
// link leads to.
func writeCodebaseTar(w io.Writer, dir string, files []LocalFile) error {
	tree, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("codebase directory: %w", err)
	}
	defer tree.Close()
	tw := tar.NewWriter(w)
	buf := make([]byte, 256<<10)
	for _, f := range files {
		var link string
		if f.Info.Mode()&fs.ModeSymlink != 0 {
			var err error
			if link, err = tree.Readlink(filepath.FromSlash(f.Rel)); err != nil {
				return fmt.Errorf("read symlink %s: %w", f.Rel, err)
			}
		}
		h, err := tar.FileInfoHeader(f.Info, link)
		if err != nil {
			return fmt.Errorf("tar header of %s: %w", f.Rel, err)
		}
		h.Name = f.Rel
		if f.Info.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if f.Info.Mode().IsRegular() {
			if err := copyFile(tw, tree, f, buf); err != nil {
				return fmt.Errorf("read %s: %w", f.Rel, err)
			}
		}
	}
	return tw.Close()
}

// copyFile copies the regular file f.Rel of tree, which must still be the
// file the walk saw (f.Info), exactly f.Info.Size() bytes.
func copyFile(w io.Writer, tree *os.Root, f LocalFile, buf []byte) error {
	fh, err := tree.OpenFile(filepath.FromSlash(f.Rel), os.O_RDONLY|oNoFollow, 0)
	if err != nil {
		return err
	}
	defer fh.Close()
	now, err := fh.Stat()
	if err != nil {
		return err
	}
	if !now.Mode().IsRegular() || !os.SameFile(now, f.Info) {
		return errors.New("replaced during the upload (by a symlink or another file); not read")
	}
	size := f.Info.Size()
	n, err := io.CopyBuffer(w, io.LimitReader(fh, size), buf)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("file shrank from %d to %d bytes during the upload", size, n)
	}
	return nil
}

// CreateCodebase uploads the directory dir as a new codebase, leaving out
// what .gitignore, .sandboxignore and opts.Ignore exclude (those files never
// leave this machine) and files over opts.MaxFileBytes. The response lists
// every skipped file.
func (c *Client) CreateCodebase(ctx context.Context, dir string, opts UploadOptions) (*sbxv1.CreateCodebaseResponse, error) {
	files, skipped, err := WalkCodebase(dir, opts)
	if err != nil {
		return nil, err
	}
	maxFile := opts.MaxFileBytes
	if maxFile < 0 {
		maxFile = 0
	} else if maxFile == 0 {
		maxFile = DefaultMaxFileBytes
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeCodebaseTar(pw, dir, files)) }()
	defer pr.Close()
	var body io.Reader = pr
	if opts.Progress != nil {
		var total int64
		for _, f := range files {
			if f.Info.Mode().IsRegular() {
				total += f.Info.Size()
			}
		}
		body = &countingReader{r: pr, report: func(n int64) { opts.Progress(n, total) }}
	}
	stream := c.codebases.CreateCodebase(ctx)
	hdr := &sbxv1.CreateCodebaseRequest{Msg: &sbxv1.CreateCodebaseRequest_Header{Header: &sbxv1.CreateCodebaseHeader{
		Name: opts.Name, MaxFileBytes: maxFile, Skipped: skipped,
	}}}
	if err := sendChunks(stream.Send, hdr, body, func(b []byte) *sbxv1.CreateCodebaseRequest {
		return &sbxv1.CreateCodebaseRequest{Msg: &sbxv1.CreateCodebaseRequest_Data{Data: b}}
	}); err != nil {
		stream.CloseAndReceive() //nolint:errcheck
		return nil, wrap("create codebase from "+dir, err)
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, wrap("create codebase from "+dir, err)
	}
	return resp.Msg, nil
}

// countingReader reports the bytes read so far after each read.
type countingReader struct {
	r      io.Reader
	n      int64
	report func(int64)
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	c.report(c.n)
	return n, err
}

// GetCodebase describes a codebase by id or name.
func (c *Client) GetCodebase(ctx context.Context, ref string) (*sbxv1.Codebase, error) {
	resp, err := c.codebases.GetCodebase(ctx, connect.NewRequest(&sbxv1.GetCodebaseRequest{Codebase: ref}))
	if err != nil {
		return nil, wrap("get codebase "+ref, err)
	}
	return resp.Msg.GetCodebase(), nil
}

// ListCodebases describes every codebase.
func (c *Client) ListCodebases(ctx context.Context) ([]*sbxv1.Codebase, error) {
	resp, err := c.codebases.ListCodebases(ctx, connect.NewRequest(&sbxv1.ListCodebasesRequest{}))
	if err != nil {
		return nil, wrap("list codebases", err)
	}
	return resp.Msg.GetCodebases(), nil
}

// DownloadCodebase writes the codebase's current revision to w as a tar.
func (c *Client) DownloadCodebase(ctx context.Context, ref string, w io.Writer) error {
	stream, err := c.codebases.DownloadCodebase(ctx, connect.NewRequest(&sbxv1.DownloadCodebaseRequest{Codebase: ref}))
	if err != nil {
		return wrap("download codebase "+ref, err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().GetData()); err != nil {
			return err
		}
	}
	return wrap("download codebase "+ref, stream.Err())
}

// DeleteCodebase removes a codebase; it fails while a sandbox mounts it.
func (c *Client) DeleteCodebase(ctx context.Context, ref string) error {
	_, err := c.codebases.DeleteCodebase(ctx, connect.NewRequest(&sbxv1.DeleteCodebaseRequest{Codebase: ref}))
	return wrap("delete codebase "+ref, err)
}

// SyncOptions tune SyncCodebase.
type SyncOptions struct {
	// Path is the codebase's mount path in the sandbox ("": its only one).
	Path   string
	DryRun bool
	// Force writes conflicting paths too (the sandbox's version wins).
	Force bool
}

// SyncCodebase writes the sandbox's changes under a codebase mount back into
// the codebase. Conflicts (paths the codebase changed after the sandbox's
// base) are listed in the response; unless forced nothing is written then.
func (c *Client) SyncCodebase(ctx context.Context, sandbox string, opts SyncOptions) (*sbxv1.SyncCodebaseResponse, error) {
	resp, err := c.codebases.SyncCodebase(ctx, connect.NewRequest(&sbxv1.SyncCodebaseRequest{
		Sandbox: sandbox, Path: opts.Path, DryRun: opts.DryRun, Force: opts.Force,
	}))
	if err != nil {
		return nil, wrap("sync codebase of "+sandbox, err)
	}
	return resp.Msg, nil
}

// SyncCodebase syncs this sandbox's changes under a codebase mount back.
func (s *Sandbox) SyncCodebase(ctx context.Context, opts SyncOptions) (*sbxv1.SyncCodebaseResponse, error) {
	return s.c.SyncCodebase(ctx, s.ID, opts)
}

// DestroySynced syncs every codebase mount back (without force), then
// destroys the sandbox; a conflict refuses the destroy (FailedPrecondition).
func (s *Sandbox) DestroySynced(ctx context.Context) error {
	_, err := s.c.api.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: s.ID, SyncCodebases: true}))
	return wrap("destroy sandbox "+s.ID, err)
}
