//go:build linux

//sbx:hostile-tree

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
	"unicode/utf8"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/boxcopy"
	"github.com/sbxdev/sbx/internal/crashpoint"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/safepath"
	"github.com/sbxdev/sbx/internal/store"
	"golang.org/x/sys/unix"
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
//
// Every tree involved is hostile: the sandbox's layer, and the codebase's
// trees too, which hold what earlier syncs (of other sandboxes) put there,
// symlinks included. All of them are read and written through
// internal/safepath, so no symlink in any component is ever followed: a path
// below a symlink does not exist as such. File data is copied with its holes
// kept and bounded by the mount's layer size (the sandbox's disk limit) and
// Config.MaxBytes.
func (m *Manager) Sync(ctx context.Context, sandboxID, path string, dryRun, force bool) (*sbxv1.SyncCodebaseResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, err := m.mountLookup(ctx, sandboxID, path)
	if err != nil {
		return nil, err
	}
	// The mount names the codebase: its sandbox's tenant's (Mount saw to it).
	rec, err := m.cfg.Store.GetCodebaseByID(ctx, mt.CodebaseID)
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
	up, err := safepath.OpenRoot(filepath.Join(mt.Dir, "rw", "upper"))
	if err != nil {
		return nil, fmt.Errorf("open sandbox layer: %w", err)
	}
	defer up.Close()
	entries, err := scanUpper(up)
	if err != nil {
		return nil, err
	}
	cur, err := safepath.OpenRoot(m.tree(rec.ID, rec.Revision))
	if err != nil {
		return nil, fmt.Errorf("open codebase tree: %w", err)
	}
	defer cur.Close()
	lower, err := safepath.OpenRoot(m.tree(rec.ID, mt.LowerRev))
	if err != nil {
		return nil, fmt.Errorf("open codebase tree: %w", err)
	}
	defer lower.Close()
	cs := &conflictState{synced: synced, changes: changes, lower: mt.LowerRev}
	p, err := planSync(entries, cs, cur, up)
	if err != nil {
		return nil, err
	}
	err = planVanished(p, entries, cs, cur, lower)
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
	if err := removeTree(tmp); err != nil {
		return nil, fmt.Errorf("remove leftover sync tree: %w", err)
	}
	budget := boxcopy.NewBudget(m.syncLimit(mt.Dir), fmt.Sprintf("the sandbox's disk limit for %s", mt.Path))
	files, size, err := m.applySync(cur, tmp, up, p.ops, budget)
	if err != nil {
		removeTree(tmp)
		return nil, fmt.Errorf("write sync of sandbox %s into codebase %s: %w", sandboxID, rec.ID, err)
	}
	release, err := m.reserve(ctx, size-rec.SizeBytes)
	if err != nil {
		removeTree(tmp)
		return nil, fmt.Errorf("sync sandbox %s into codebase %s: %w", sandboxID, rec.ID, err)
	}
	defer release()
	// safepath:ok: both are the daemon's own names in the trees dir.
	if err := os.Rename(tmp, m.tree(rec.ID, newRev)); err != nil {
		removeTree(tmp)
		return nil, fmt.Errorf("store synced tree: %w", err)
	}
	crashpoint.Hit("sync-tree")
	newSynced := p.equal
	for _, o := range p.ops {
		newSynced[o.e.rel] = store.SyncedPath{Revision: newRev, Fingerprint: o.e.fp}
	}
	commit := &store.CodebaseCommit{
		CodebaseID: rec.ID, Revision: newRev, FileCount: files, SizeBytes: size, UpdatedAtMs: time.Now().UnixMilli(),
		Changed: p.changed, SandboxID: sandboxID, MountPath: mt.Path, Synced: newSynced,
	}
	if err := m.cfg.Store.CommitCodebase(ctx, commit); err != nil {
		removeTree(m.tree(rec.ID, newRev))
		return nil, err
	}
	crashpoint.Hit("sync-committed")
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
// symlinks; sockets, FIFOs and devices other than whiteouts are ignored. A
// name that is not UTF-8 refuses the sync before anything is written (the
// API and the state database carry paths as UTF-8 strings).
func scanUpper(up *safepath.Root) ([]upperEntry, error) {
	var out []upperEntry
	err := up.Walk(".", func(rel string, d safepath.Entry) error {
		if !utf8.ValidString(rel) {
			return fmt.Errorf("%w: sandbox path %q is not valid UTF-8: rename or remove it in the sandbox to sync", errdefs.ErrInvalidArgument, rel)
		}
		fi, _ := d.Info()
		st := d.Stat()
		e := upperEntry{rel: rel, mode: fi.Mode(), uid: st.Uid, gid: st.Gid, size: st.Size, mtime: fi.ModTime()}
		switch {
		case fi.IsDir():
			e.kind = kindDir
			v, ok, err := up.Getxattr(rel, "trusted.overlay.opaque")
			if err != nil {
				return err
			}
			e.opaque = ok && len(v) >= 1 && v[0] == 'y'
		case fi.Mode().IsRegular():
			e.kind = kindFile
			e.fp = fmt.Sprintf("f:%d:%d:%d:%d:%o", st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano(), st.Mode)
		case fi.Mode()&fs.ModeSymlink != 0:
			e.kind = kindSymlink
			var err error
			if e.target, err = up.Readlink(rel); err != nil {
				return err
			}
			e.fp = fmt.Sprintf("l:%d:%d:%s", st.Ino, st.Ctim.Nano(), e.target)
		case isWhiteout(st.Mode, st.Rdev):
			e.kind = kindWhiteout
			e.fp = "w"
		default:
			return nil
		}
		out = append(out, e)
		return nil
	})
	if errdefs.IsInvalidArgument(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("read sandbox layer: %w", err)
	}
	return out, nil
}

// lstatTree describes rel in a codebase tree, or returns nil when it does
// not exist there as such: missing, or below a file or a symlink (a symlink
// in a codebase is an entry of its own, never a way into anything).
func lstatTree(r *safepath.Root, rel string) (fs.FileInfo, error) {
	fi, err := r.Lstat(rel)
	switch {
	case err == nil:
		return fi, nil
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ENOTDIR), errors.Is(err, safepath.ErrSymlink):
		return nil, nil
	}
	return nil, fmt.Errorf("stat codebase path %s: %w", rel, err)
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
func planSync(entries []upperEntry, cs *conflictState, cur, up *safepath.Root) (*syncPlan, error) {
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
		cfi, err := lstatTree(cur, e.rel)
		if err != nil {
			return nil, err
		}
		exists := cfi != nil
		if underReplaced(e.rel) {
			exists = false
		}
		switch e.kind {
		case kindDir:
			if e.opaque {
				if exists {
					addConflicts(cs.subtree(e.rel)...)
					dels, err := listTree(cur, e.rel)
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
				same, err := sameContent(e, cfi, cur, up)
				if err != nil {
					return nil, err
				}
				if same {
					p.equal[e.rel] = store.SyncedPath{Revision: max(cs.base(e.rel), cs.changes[e.rel]), Fingerprint: e.fp}
					continue
				}
				if cfi.IsDir() {
					addConflicts(cs.subtree(e.rel)...)
					dels, err := listTree(cur, e.rel)
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
			dels, err := listTree(cur, e.rel)
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
func planVanished(p *syncPlan, entries []upperEntry, cs *conflictState, cur, lower *safepath.Root) error {
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
		if fi, err := lstatTree(lower, sp); err != nil {
			return err
		} else if fi != nil {
			continue // the sandbox sees the lower layer's version: nothing it changed
		}
		if fi, err := lstatTree(cur, sp); err != nil {
			return err
		} else if fi == nil {
			continue // not in the codebase either
		}
		p.conflicts = append(p.conflicts, cs.subtree(sp)...)
		dels, err := listTree(cur, sp)
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

// listTree lists rel and everything below it in a codebase tree.
func listTree(cur *safepath.Root, rel string) ([]string, error) {
	out := []string{rel}
	fi, err := lstatTree(cur, rel)
	if err != nil || fi == nil || !fi.IsDir() {
		return out, err
	}
	err = cur.Walk(rel, func(r string, _ safepath.Entry) error {
		out = append(out, r)
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
func sameContent(e upperEntry, cfi fs.FileInfo, cur, up *safepath.Root) (bool, error) {
	switch e.kind {
	case kindSymlink:
		if cfi.Mode()&fs.ModeSymlink == 0 {
			return false, nil
		}
		t, err := cur.Readlink(e.rel)
		return err == nil && t == e.target, nil
	case kindFile:
		if !cfi.Mode().IsRegular() || cfi.Size() != e.size || cfi.Mode().Perm() != e.mode.Perm() {
			return false, nil
		}
		a, err := openUpper(up, e.rel)
		if err != nil {
			return false, err
		}
		defer a.Close()
		b, err := cur.Open(e.rel)
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

// openUpper opens a regular file of the sandbox's layer (O_NONBLOCK: a
// FIFO swapped in must not hang the daemon).
func openUpper(up *safepath.Root, rel string) (*os.File, error) {
	f, err := up.OpenFile(rel, os.O_RDONLY|unix.O_NONBLOCK, 0)
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

// syncLimit is what one sync may write: the mount's layer size (the
// sandbox's disk limit) and at most Config.MaxBytes.
func (m *Manager) syncLimit(mountDir string) int64 {
	limit := m.cfg.MaxBytes
	var st unix.Statfs_t
	// safepath:ok: the mount's rw dir is the daemon's tmpfs mount point.
	if err := unix.Statfs(filepath.Join(mountDir, "rw"), &st); err == nil && st.Blocks > 0 {
		limit = min(limit, int64(st.Blocks)*st.Bsize)
	}
	return limit
}

// applySync makes the tree dst (a new directory) a hardlink copy of cur with
// ops applied, and counts its files and bytes.
func (m *Manager) applySync(cur *safepath.Root, dst string, up *safepath.Root, ops []syncOp, budget *boxcopy.Budget) (files, size int64, err error) {
	// safepath:ok: dst is the daemon's own new tree dir.
	if err := os.Mkdir(dst, 0o700); err != nil {
		return 0, 0, fmt.Errorf("create sync tree: %w", err)
	}
	// The new tree's root keeps the old one's owner and mode: boxes (and
	// the overlay over it, working as sandbox root) must traverse it.
	if fi, err := cur.Lstat("."); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			// safepath:ok: dst is the daemon's own new tree dir.
			if err := os.Lchown(dst, m.owner(st.Uid), m.owner(st.Gid)); err != nil {
				return 0, 0, fmt.Errorf("chown sync tree: %w", err)
			}
		}
		// safepath:ok: dst is the daemon's own new tree dir.
		if err := os.Chmod(dst, fi.Mode().Perm()); err != nil {
			return 0, 0, fmt.Errorf("chmod sync tree: %w", err)
		}
	}
	out, err := safepath.OpenRoot(dst)
	if err != nil {
		return 0, 0, err
	}
	defer out.Close()
	if err := linkCopy(cur, out); err != nil {
		return 0, 0, err
	}
	for _, o := range ops {
		if err := m.applyOp(out, up, o, budget); err != nil {
			return 0, 0, err
		}
	}
	return countTree(out)
}

func (m *Manager) applyOp(out, up *safepath.Root, o syncOp, budget *boxcopy.Budget) error {
	e := o.e
	uid, gid := m.owner(e.uid), m.owner(e.gid)
	switch o.kind {
	case opDir, opReplaceDir:
		fi, err := lstatTree(out, e.rel)
		if err != nil {
			return err
		}
		if o.kind == opReplaceDir || (fi != nil && !fi.IsDir()) {
			if err := out.RemoveAll(e.rel); err != nil {
				return err
			}
			fi = nil
		}
		if fi == nil {
			if err := out.Mkdir(e.rel, 0o700); err != nil {
				return err
			}
		}
		if err := out.Lchown(e.rel, uid, gid); err != nil {
			return err
		}
		return out.Chmod(e.rel, e.mode&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid))
	case opFile:
		if err := out.RemoveAll(e.rel); err != nil {
			return err
		}
		return copyFromUpper(up, e, out, uid, gid, budget)
	case opSymlink:
		if err := out.RemoveAll(e.rel); err != nil {
			return err
		}
		if err := out.Symlink(e.target, e.rel); err != nil {
			return err
		}
		return out.Lchown(e.rel, uid, gid)
	case opDelete:
		return out.RemoveAll(e.rel)
	}
	return nil
}

// copyFromUpper copies a file of the sandbox's layer into out, keeping its
// holes, within budget.
func copyFromUpper(up *safepath.Root, e upperEntry, out *safepath.Root, uid, gid int, budget *boxcopy.Budget) error {
	src, err := openUpper(up, e.rel)
	if err != nil {
		return err
	}
	defer src.Close()
	f, err := out.OpenFile(e.rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := boxcopy.CopyFile(f, src, budget); err != nil {
		f.Close()
		return fmt.Errorf("copy %s: %w", e.rel, err)
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
	return out.Chtimes(e.rel, e.mtime, e.mtime)
}

// linkCopy copies the tree src into dst: directories are made anew (same
// mode, owner and times), everything else is hardlinked.
func linkCopy(src, dst *safepath.Root) error {
	err := src.Walk(".", func(rel string, e safepath.Entry) error {
		if !e.IsDir() {
			return dst.Link(src, rel, rel)
		}
		fi, _ := e.Info()
		st := e.Stat()
		if err := dst.Mkdir(rel, 0o700); err != nil {
			return err
		}
		if err := dst.Lchown(rel, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := dst.Chmod(rel, fi.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid)); err != nil {
			return err
		}
		return dst.Chtimes(rel, fi.ModTime(), fi.ModTime())
	})
	if err != nil {
		return fmt.Errorf("copy codebase tree: %w", err)
	}
	return nil
}

// countTree counts the regular files of a tree and their (apparent) size.
func countTree(r *safepath.Root) (files, size int64, err error) {
	err = r.Walk(".", func(_ string, e safepath.Entry) error {
		if e.Type().IsRegular() {
			files++
			size += e.Stat().Size
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("count codebase files: %w", err)
	}
	return files, size, nil
}
