//sbx:hostile-tree

package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxdev/sbx/internal/safepath"
)

// Prune deletes what no stored image references: layer dirs (unless listed
// in inUse, the absolute layer dirs of live sandboxes, as Image.Layers gives
// them) and blobs. It waits for running pulls, imports and exports, and
// blocks new ones while it runs. Images held by a Lease are kept. The
// caller must make sure no sandbox is being created from a layer not in
// inUse meanwhile. It returns the bytes freed (disk blocks: a sparse
// file's holes free nothing).
func (s *Store) Prune(ctx context.Context, inUse map[string]bool) (freed int64, err error) {
	s.gc.Lock()
	defer s.gc.Unlock()

	keepLayers := map[string]bool{}
	keepBlobs := map[string]bool{}
	s.mu.Lock()
	// Untagged intermediate images of builds go first; build caches miss
	// on them afterwards and redo (or recompose) the step.
	tagged := map[string]bool{}
	for _, d := range s.refs {
		tagged[d] = true
	}
	for d, r := range s.records {
		if r.Intermediate && !tagged[d] && !s.leasedLocked(d) {
			// safepath:ok: an image record, named by its digest.
			if err := os.Remove(s.recordPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.mu.Unlock()
				return 0, fmt.Errorf("prune: %w", err)
			}
			delete(s.records, d)
		}
	}
	for _, r := range s.records {
		keepBlobs[hexOf(r.Digest)] = true
		keepBlobs[hexOf(r.ConfigDigest)] = true
		for _, l := range r.Layers {
			keepBlobs[hexOf(l.Digest)] = true
			keepLayers[hexOf(l.DiffID)] = true
		}
	}
	s.mu.Unlock()
	for p := range inUse {
		keepLayers[filepath.Base(filepath.Clean(p))] = true
	}

	var errs []error
	layers := filepath.Join(s.cfg.Dir, "layers")
	// safepath:ok: the store's own layers dir.
	ents, err := os.ReadDir(layers)
	if err != nil {
		return 0, fmt.Errorf("prune: %w", err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return freed, err
		}
		hex := strings.TrimSuffix(e.Name(), ".json")
		if keepLayers[hex] {
			continue
		}
		p := filepath.Join(layers, e.Name())
		if e.IsDir() {
			// Metadata first: a dir without metadata counts as absent.
			// safepath:ok: a layer's metadata file, named by the store.
			if err := os.Remove(p + ".json"); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
		}
		n, err := removeAll(p)
		freed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	blobs := filepath.Join(s.cfg.Dir, "blobs", "sha256")
	// safepath:ok: the store's own blobs dir.
	ents, err = os.ReadDir(blobs)
	if err != nil {
		return freed, fmt.Errorf("prune: %w", err)
	}
	for _, e := range ents {
		if keepBlobs[e.Name()] {
			continue
		}
		n, err := removeAll(filepath.Join(blobs, e.Name()))
		freed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	// Nothing is in progress while we hold gc: whatever is in tmp is junk.
	// safepath:ok: the store's own tmp dir.
	tmps, _ := os.ReadDir(s.tmpDir())
	for _, e := range tmps {
		n, err := removeAll(filepath.Join(s.tmpDir(), e.Name()))
		freed += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return freed, fmt.Errorf("prune: %w", err)
	}
	s.log.Info("image store pruned", "freed_bytes", freed)
	return freed, nil
}

// removeAll removes p and returns the disk space its files held. A layer
// dir's tree came out of a tar (a sandbox's snapshot, a registry's layer):
// it is measured and removed through safepath, never following a symlink
// in it, and sparse files count for the blocks they take, not their size.
func removeAll(p string) (int64, error) {
	parent, err := safepath.OpenRoot(filepath.Dir(p))
	if err != nil {
		return 0, err
	}
	defer parent.Close()
	base := filepath.Base(p)
	var n int64
	if fi, err := parent.Lstat(base); err == nil {
		n += safepath.Stat(fi).Blocks * 512
		if fi.IsDir() {
			_ = parent.Walk(base, func(_ string, e safepath.Entry) error {
				n += e.Stat().Blocks * 512
				return nil
			})
		}
	}
	return n, parent.RemoveAll(base)
}

// DiskUsage reports how many images and unpacked layers the store holds and
// the bytes they take: the uncompressed size of the layers plus the blobs.
func (s *Store) DiskUsage(ctx context.Context) (images, layers int64, bytes int64, err error) {
	s.mu.Lock()
	images = int64(len(s.records))
	s.mu.Unlock()
	// safepath:ok: the store's own layers dir.
	ents, err := os.ReadDir(filepath.Join(s.cfg.Dir, "layers"))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("disk usage: %w", err)
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		var m layerMeta
		if err := readJSON(filepath.Join(s.cfg.Dir, "layers", e.Name()), &m); err != nil || !isDir(s.layerDir(name)) {
			continue
		}
		layers++
		bytes += m.Size
	}
	// safepath:ok: the store's own blobs dir.
	ents, err = os.ReadDir(filepath.Join(s.cfg.Dir, "blobs", "sha256"))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("disk usage: %w", err)
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			bytes += fi.Size()
		}
	}
	return images, layers, bytes, nil
}
