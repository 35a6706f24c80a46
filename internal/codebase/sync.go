package codebase

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/store"
)

// Sync writes the changes a sandbox made under one codebase mount (its
// overlay upper dir) back into the codebase as a new revision. The caller
// freezes the sandbox so the layer holds still while it is read.
//
// A path is a conflict when the codebase changed it at a revision newer than
// the sandbox's base for that path: the revision of its lower layer, or the
// revision at which this mount last synced the path. With a conflict and
// without force nothing is written. Entries unchanged since this mount's
// last sync (same fingerprint) and entries equal to the codebase's current
// content are not written again.
func (m *Manager) Sync(ctx context.Context, sandboxID, path string, dryRun, force bool) (*sbxv1.SyncCodebaseResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, err := m.mountLookup(ctx, sandboxID, path)
	if err != nil {
		return nil, err
	}
	rec, err := m.cfg.Store.GetCodebase(ctx, mt.CodebaseID)
	if err != nil {
		return nil, err
	}
	synced, err := m.cfg.Store.SyncedPaths(ctx, sandboxID, mt.Path)
	if err != nil {
		return nil, err
	}
	changes, err := m.cfg.Store.CodebaseChanges(ctx, rec.ID, mt.LowerRev)
	if err != nil {
		return nil, err
	}
	upper := filepath.Join(mt.Dir, "rw", "upper")
	entries, err := scanUpper(upper)
	if err != nil {
		return nil, err
	}
	cur := m.tree(rec.ID, rec.Revision)
	cs := &conflictState{synced: synced, changes: changes, lower: mt.LowerRev}
	p, err := planSync(entries, cs, cur, upper)
	if err != nil {
		return nil, err
	}
	err = planVanished(p, entries, cs, cur, m.tree(rec.ID, mt.LowerRev))
	if err != nil {
		return nil, err
	}
	resp := &sbxv1.SyncCodebaseResponse{Codebase: rec.ID, Revision: rec.Revision, Conflicts: p.conflicts}
	if dryRun {
		resp.Written, resp.Deleted = p.written, p.deleted
		return resp, nil
	}
	if len(p.conflicts) > 0 && !force {
		return resp, nil
	}
	if len(p.ops) == 0 {
		if err := m.cfg.Store.UpsertSynced(ctx, sandboxID, mt.Path, p.equal); err != nil {
			return nil, err
		}
		return resp, nil
	}
	newRev := rec.Revision + 1
	tmp := filepath.Join(m.treesDir(), rec.ID, ".sync")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("remove leftover sync tree: %w", err)
	}
	if err := m.applySync(cur, tmp, upper, p.ops); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("write sync of sandbox %s into codebase %s: %w", sandboxID, rec.ID, err)
	}
	files, size, err := countTree(tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, m.tree(rec.ID, newRev)); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("store synced tree: %w", err)
	}
	newSynced := p.equal
	for _, o := range p.ops {
		newSynced[o.e.rel] = store.SyncedPath{Revision: newRev, Fingerprint: o.e.fp}
	}
	commit := &store.CodebaseCommit{
		CodebaseID: rec.ID, Revision: newRev, FileCount: files, SizeBytes: size, UpdatedAtMs: time.Now().UnixMilli(),
		Changed: p.changed, SandboxID: sandboxID, MountPath: mt.Path, Synced: newSynced,
	}
	if err := m.cfg.Store.CommitCodebase(ctx, commit); err != nil {
		os.RemoveAll(m.tree(rec.ID, newRev))
		return nil, err
	}
	m.gcLocked(ctx)
	resp.Revision, resp.Written, resp.Deleted = newRev, p.written, p.deleted
	m.log.Info("codebase synced", "codebase", rec.ID, "revision", newRev, "sandbox", sandboxID,
		"written", len(p.written), "deleted", len(p.deleted), "forced_conflicts", len(p.conflicts))
	return resp, nil
}

type entryKind int

const (
	kindDir entryKind = iota
	kindFile
	kindSymlink
	kindWhiteout
)

// upperEntry is one entry of an overlay upper dir.
type upperEntry struct {
	rel    string // slash-separated, relative to the codebase root
	kind   entryKind
	opaque bool // directory marked opaque: hides everything below it in the lower
	mode   fs.FileMode
	uid    uint32
	gid    uint32
	size   int64
	mtime  time.Time
	target string // symlink target
	// fp identifies the entry's state; unchanged fp means unchanged content.
	fp string
}

// scanUpper lists an upper dir, parents before children. It never follows
// symlinks; sockets, FIFOs and devices other than whiteouts are ignored.
func scanUpper(upper string) ([]upperEntry, error) {
	var out []upperEntry
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("stat %s: no stat_t", rel)
		}
		e := upperEntry{rel: filepath.ToSlash(rel), mode: fi.Mode(), uid: st.Uid, gid: st.Gid, size: fi.Size(), mtime: fi.ModTime()}
		switch {
		case fi.IsDir():
			e.kind = kindDir
			e.opaque = isOpaque(p)
		case fi.Mode().IsRegular():
			e.kind = kindFile
			e.fp = fmt.Sprintf("f:%d:%d:%d:%d:%o", st.Ino, st.Size, mtimeNs(st), ctimeNs(st), st.Mode)
		case fi.Mode()&fs.ModeSymlink != 0:
			e.kind = kindSymlink
			if e.target, err = os.Readlink(p); err != nil {
				return err
			}
			e.fp = fmt.Sprintf("l:%d:%d:%s", st.Ino, ctimeNs(st), e.target)
		case isWhiteout(uint32(st.Mode), uint64(st.Rdev)):
			e.kind = kindWhiteout
			e.fp = "w"
		default:
			return nil
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read sandbox layer: %w", err)
	}
	return out, nil
}

// conflictState answers "did the codebase change this path after the
// sandbox's base for it?".
type conflictState struct {
	synced  map[string]store.SyncedPath
	changes map[string]int64 // paths changed after lower
	lower   int64
}

func (c *conflictState) base(p string) int64 {
	if s, ok := c.synced[p]; ok && s.Revision > c.lower {
		return s.Revision
	}
	return c.lower
}

// conflict returns a conflict for p itself, if any.
func (c *conflictState) conflict(p string) *sbxv1.SyncConflict {
	if r, ok := c.changes[p]; ok && r > c.base(p) {
		return &sbxv1.SyncConflict{Path: p, Reason: fmt.Sprintf("changed in the codebase at revision %d, after this sandbox's base revision %d", r, c.base(p))}
	}
	return nil
}

// subtree returns conflicts for p and every path below it.
func (c *conflictState) subtree(p string) []*sbxv1.SyncConflict {
	var out []*sbxv1.SyncConflict
	for cp := range c.changes {
		if cp == p || strings.HasPrefix(cp, p+"/") {
			if cf := c.conflict(cp); cf != nil {
				out = append(out, cf)
			}
		}
	}
	return out
}

type opKind int

const (
	opDir        opKind = iota // make sure a directory with these attributes exists
	opReplaceDir               // remove what is there, make an empty directory (opaque)
	opFile
	opSymlink
	opDelete
)

type syncOp struct {
	kind opKind
	e    upperEntry
}

type syncPlan struct {
	ops              []syncOp
	written, deleted []string
	// changed: every path whose revision becomes the new one.
	changed   []string
	conflicts []*sbxv1.SyncConflict
	// equal: entries found equal to the codebase; recorded as synced.
	equal map[string]store.SyncedPath
}

// planSync decides what a sync writes. cur is the codebase's current tree,
// upper the sandbox's layer (for comparing contents).
func planSync(entries []upperEntry, cs *conflictState, cur, upper string) (*syncPlan, error) {
	p := &syncPlan{equal: map[string]store.SyncedPath{}}
	seenConflict := map[string]bool{}
	addConflicts := func(cfs ...*sbxv1.SyncConflict) {
		for _, cf := range cfs {
			if cf != nil && !seenConflict[cf.Path] {
				seenConflict[cf.Path] = true
				p.conflicts = append(p.conflicts, cf)
			}
		}
	}
	// Paths below an opaque directory are compared against nothing: the
	// directory was replaced as a whole.
	var replaced []string
	underReplaced := func(rel string) bool {
		for _, r := range replaced {
			if strings.HasPrefix(rel, r+"/") {
				return true
			}
		}
		return false
	}
	for _, e := range entries {
		curPath := filepath.Join(cur, filepath.FromSlash(e.rel))
		cfi, cerr := os.Lstat(curPath)
		exists := cerr == nil
		if cerr != nil && !errors.Is(cerr, fs.ErrNotExist) && !errors.Is(cerr, syscall.ENOTDIR) {
			return nil, fmt.Errorf("stat codebase path %s: %w", e.rel, cerr)
		}
		if underReplaced(e.rel) {
			exists = false
		}
		switch e.kind {
		case kindDir:
			if e.opaque {
				if exists {
					addConflicts(cs.subtree(e.rel)...)
					dels, err := listTree(curPath, e.rel)
					if err != nil {
						return nil, err
					}
					p.changed = append(p.changed, dels...)
					p.deleted = append(p.deleted, notIn(dels, entries, e.rel)...)
				}
				replaced = append(replaced, e.rel)
				p.ops = append(p.ops, syncOp{opReplaceDir, e})
				p.written = append(p.written, e.rel+"/")
				p.changed = append(p.changed, e.rel)
				continue
			}
			if exists && cfi.IsDir() {
				if cfi.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid) == e.mode&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid) {
					continue
				}
			} else {
				// A file in the codebase now, or deleted from it.
				addConflicts(cs.conflict(e.rel))
			}
			p.ops = append(p.ops, syncOp{opDir, e})
			p.written = append(p.written, e.rel+"/")
			p.changed = append(p.changed, e.rel)
		case kindFile, kindSymlink:
			if s, ok := cs.synced[e.rel]; ok && s.Fingerprint == e.fp {
				continue // unchanged since this mount synced it
			}
			if exists {
				same, err := sameContent(e, cfi, curPath, upper)
				if err != nil {
					return nil, err
				}
				if same {
					p.equal[e.rel] = store.SyncedPath{Revision: max(cs.base(e.rel), cs.changes[e.rel]), Fingerprint: e.fp}
					continue
				}
				if cfi.IsDir() {
					addConflicts(cs.subtree(e.rel)...)
					dels, err := listTree(curPath, e.rel)
					if err != nil {
						return nil, err
					}
					p.changed = append(p.changed, dels...)
					p.deleted = append(p.deleted, dels...)
				}
			}
			addConflicts(cs.conflict(e.rel))
			k := opFile
			if e.kind == kindSymlink {
				k = opSymlink
			}
			p.ops = append(p.ops, syncOp{k, e})
			p.written = append(p.written, e.rel)
			p.changed = append(p.changed, e.rel)
		case kindWhiteout:
			if s, ok := cs.synced[e.rel]; ok && s.Fingerprint == e.fp {
				continue
			}
			if !exists {
				continue // deleted here and (no longer) in the codebase either
			}
			addConflicts(cs.subtree(e.rel)...)
			dels, err := listTree(curPath, e.rel)
			if err != nil {
				return nil, err
			}
			p.ops = append(p.ops, syncOp{opDelete, e})
			p.deleted = append(p.deleted, dels...)
			p.changed = append(p.changed, dels...)
		}
	}
	sortConflicts(p)
	return p, nil
}

func sortConflicts(p *syncPlan) {
	sort.Slice(p.conflicts, func(i, j int) bool { return p.conflicts[i].Path < p.conflicts[j].Path })
}

// fpGone marks a synced path the sandbox later removed without a trace.
const fpGone = "gone"

// planVanished adds deletions of paths this mount synced earlier that are
// no longer in its layer and not in its lower tree either: a file or
// directory the sandbox created, synced and then removed leaves no whiteout
// (overlayfs needs none when the lower layer lacks the name).
func planVanished(p *syncPlan, entries []upperEntry, cs *conflictState, cur, lower string) error {
	inUpper := make(map[string]*upperEntry, len(entries))
	for i := range entries {
		inUpper[entries[i].rel] = &entries[i]
	}
	paths := make([]string, 0, len(cs.synced))
	for sp, s := range cs.synced {
		if s.Fingerprint != fpGone && s.Fingerprint != "w" && inUpper[sp] == nil {
			paths = append(paths, sp)
		}
	}
	sort.Strings(paths)
	var gone []string
	for _, sp := range paths {
		if slices.ContainsFunc(gone, func(g string) bool { return strings.HasPrefix(sp, g+"/") }) {
			continue
		}
		// Hidden by a whiteout or opaque directory above it: handled there.
		hidden := false
		for d := path.Dir(sp); d != "." && !hidden; d = path.Dir(d) {
			if e := inUpper[d]; e != nil && (e.kind != kindDir || e.opaque) {
				hidden = true
			}
		}
		if hidden {
			continue
		}
		if _, err := os.Lstat(filepath.Join(lower, filepath.FromSlash(sp))); err == nil {
			continue // the sandbox sees the lower layer's version: nothing it changed
		}
		curPath := filepath.Join(cur, filepath.FromSlash(sp))
		if _, err := os.Lstat(curPath); err != nil {
			continue // not in the codebase either
		}
		p.conflicts = append(p.conflicts, cs.subtree(sp)...)
		dels, err := listTree(curPath, sp)
		if err != nil {
			return err
		}
		gone = append(gone, sp)
		p.ops = append(p.ops, syncOp{opDelete, upperEntry{rel: sp, kind: kindWhiteout, fp: fpGone}})
		p.deleted = append(p.deleted, dels...)
		p.changed = append(p.changed, dels...)
	}
	seen := map[string]bool{}
	out := p.conflicts[:0]
	for _, c := range p.conflicts {
		if !seen[c.Path] {
			seen[c.Path] = true
			out = append(out, c)
		}
	}
	p.conflicts = out
	sortConflicts(p)
	return nil
}

// listTree lists rel and everything below it (cur is its path in a tree).
func listTree(cur, rel string) ([]string, error) {
	out := []string{rel}
	fi, err := os.Lstat(cur)
	if err != nil || !fi.IsDir() {
		return out, nil
	}
	err = filepath.WalkDir(cur, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, err := filepath.Rel(cur, p)
		if err != nil || r == "." {
			return err
		}
		out = append(out, rel+"/"+filepath.ToSlash(r))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list codebase path %s: %w", rel, err)
	}
	return out, nil
}

// notIn returns the paths of dels (under dir) that entries does not hold.
func notIn(dels []string, entries []upperEntry, dir string) []string {
	have := map[string]bool{dir: true}
	for _, e := range entries {
		if strings.HasPrefix(e.rel, dir+"/") && e.kind != kindWhiteout {
			have[e.rel] = true
		}
	}
	var out []string
	for _, d := range dels {
		if !have[d] {
			out = append(out, d)
		}
	}
	return out
}

// sameContent reports whether an upper file or symlink equals the codebase's.
func sameContent(e upperEntry, cfi fs.FileInfo, curPath, upper string) (bool, error) {
	switch e.kind {
	case kindSymlink:
		if cfi.Mode()&fs.ModeSymlink == 0 {
			return false, nil
		}
		t, err := os.Readlink(curPath)
		return err == nil && t == e.target, nil
	case kindFile:
		if !cfi.Mode().IsRegular() || cfi.Size() != e.size || cfi.Mode().Perm() != e.mode.Perm() {
			return false, nil
		}
		a, err := openUpper(upper, e.rel)
		if err != nil {
			return false, err
		}
		defer a.Close()
		b, err := os.Open(curPath)
		if err != nil {
			return false, fmt.Errorf("open codebase file %s: %w", e.rel, err)
		}
		defer b.Close()
		return sameReaders(a, b)
	}
	return false, nil
}

func sameReaders(a, b io.Reader) (bool, error) {
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, erra := io.ReadFull(a, ba)
		nb, errb := io.ReadFull(b, bb)
		if !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		doneA := errors.Is(erra, io.EOF) || errors.Is(erra, io.ErrUnexpectedEOF)
		doneB := errors.Is(errb, io.EOF) || errors.Is(errb, io.ErrUnexpectedEOF)
		if erra != nil && !doneA {
			return false, erra
		}
		if errb != nil && !doneB {
			return false, errb
		}
		if doneA || doneB {
			return doneA == doneB, nil
		}
	}
}

// openUpper opens a regular file of the sandbox's layer without following
// any symlink (the layer is the sandbox's: hostile).
func openUpper(upper, rel string) (*os.File, error) {
	root, err := os.OpenRoot(upper)
	if err != nil {
		return nil, fmt.Errorf("open sandbox layer: %w", err)
	}
	defer root.Close()
	f, err := root.OpenFile(filepath.FromSlash(rel), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open sandbox file %s: %w", rel, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("sandbox file %s: not a regular file", rel)
	}
	return f, nil
}

// owner keeps ids inside the sandboxes' range; others become sandbox root.
func (m *Manager) owner(id uint32) int {
	if id >= m.cfg.UIDShift && id < m.cfg.UIDShift+m.cfg.IDRange {
		return int(id)
	}
	return int(m.cfg.UIDShift)
}

// applySync makes dst a hardlink copy of cur with ops applied.
func (m *Manager) applySync(cur, dst, upper string, ops []syncOp) error {
	if err := linkCopy(cur, dst); err != nil {
		return err
	}
	for _, o := range ops {
		e := o.e
		p := filepath.Join(dst, filepath.FromSlash(e.rel))
		uid, gid := m.owner(e.uid), m.owner(e.gid)
		switch o.kind {
		case opDir, opReplaceDir:
			fi, err := os.Lstat(p)
			if o.kind == opReplaceDir || (err == nil && !fi.IsDir()) {
				if err := os.RemoveAll(p); err != nil {
					return err
				}
				err = fs.ErrNotExist
			}
			if err != nil {
				if err := os.Mkdir(p, 0o700); err != nil {
					return err
				}
			}
			if err := os.Lchown(p, uid, gid); err != nil {
				return err
			}
			if err := os.Chmod(p, e.mode&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid)); err != nil {
				return err
			}
		case opFile:
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			if err := copyFromUpper(upper, e, p, uid, gid); err != nil {
				return err
			}
		case opSymlink:
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			if err := os.Symlink(e.target, p); err != nil {
				return err
			}
			if err := os.Lchown(p, uid, gid); err != nil {
				return err
			}
		case opDelete:
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFromUpper(upper string, e upperEntry, dst string, uid, gid int) error {
	src, err := openUpper(upper, e.rel)
	if err != nil {
		return err
	}
	defer src.Close()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return err
	}
	if err := f.Chown(uid, gid); err != nil {
		f.Close()
		return err
	}
	// No setuid, setgid or sticky bits from a sandbox.
	if err := f.Chmod(e.mode.Perm()); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chtimes(dst, e.mtime, e.mtime)
}

// linkCopy copies the tree src to dst: directories are made anew (same
// mode and owner), everything else is hardlinked.
func linkCopy(src, dst string) error {
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		t := filepath.Join(dst, rel)
		if !d.IsDir() {
			return os.Link(p, t)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Mkdir(t, 0o700); err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if err := os.Lchown(t, int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
		if err := os.Chmod(t, fi.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid)); err != nil {
			return err
		}
		return os.Chtimes(t, fi.ModTime(), fi.ModTime())
	})
	if err != nil {
		return fmt.Errorf("copy codebase tree: %w", err)
	}
	return nil
}
