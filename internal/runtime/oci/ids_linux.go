package oci

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/cleanup"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/hostmount"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/overlay"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/ocibox"
)

// Paths of a box's id mapping inside its box dir.
func userNSFile(box string) string { return filepath.Join(box, "userns") }
func layerDir(box string, i int) string {
	return filepath.Join(box, "layers", strconv.Itoa(i))
}
func bindDir(box string, i int) string { return filepath.Join(box, "binds", strconv.Itoa(i)) }
func rwMapDir(box string) string       { return filepath.Join(box, "rwmap") }

// boxIDs is what Create sets up for a box's own id range: its user
// namespace (owned by the range's first uid, bind-mounted in the box dir)
// and its parent, which shifts the canonical range to the box's, for the
// idmapped mounts of everything the box sees from the host.
type boxIDs struct {
	box   string
	r     idmap.Range
	shift *os.File
	undo  *cleanup.Stack
}

// newBoxIDs allocates the box's range and makes its namespaces; undo
// releases them.
func (d *Driver) newBoxIDs(box string, undo *cleanup.Stack) (*boxIDs, error) {
	r, err := d.ids.Allocate(box)
	if err != nil {
		return nil, fmt.Errorf("allocate id range: %w", err)
	}
	undo.Add(func() error { return d.ids.Release(r, box) })
	ns := userNSFile(box)
	if err := os.WriteFile(ns, nil, 0o600); err != nil {
		return nil, fmt.Errorf("create user namespace file: %w", err)
	}
	// The helper (nsHelper: the small one, or the agent of the agent
	// layer) is a file every box's root can reach and execute.
	exe := d.nsHelper
	// Its parent maps the canonical range to the box's: the idmapped
	// mounts shift through it.
	shift, err := idmap.BoxNamespace(r, exe, ns, d.boxLimits)
	if err != nil {
		return nil, fmt.Errorf("create box user namespace: %w", err)
	}
	undo.Add(func() error { return hostmount.Unmount(ns) })
	return &boxIDs{box: box, r: r, shift: shift, undo: undo}, nil
}

func (b *boxIDs) Close() error { return b.shift.Close() }

// boxLimits checks the configured per-box kernel limits (nil: the
// defaults) and lowers those above the host's, saying so.
func boxLimits(l idmap.Limits, log *slog.Logger) (idmap.Limits, error) {
	if l == nil {
		l = idmap.DefaultLimits()
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	host, err := idmap.HostLimits()
	if err != nil {
		return nil, err
	}
	out, lowered := l.Clamp(host)
	if len(lowered) > 0 {
		log.Warn("box kernel limits above the host's lowered to them", "lowered", lowered)
	}
	return out, nil
}

// mapDir attaches an idmapped copy of src at dst (created), unmounted by
// undo.
func (b *boxIDs) mapDir(src, dst string, recursive bool) error {
	if err := os.MkdirAll(dst, 0o711); err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	if err := idmap.Mount(src, dst, b.shift, recursive); err != nil {
		return err
	}
	b.undo.Add(func() error { return hostmount.Unmount(dst) })
	return nil
}

// lowers idmaps each image layer; it returns the mapped dirs, lowest first.
func (b *boxIDs) lowers(layers []string) ([]string, error) {
	out := make([]string, len(layers))
	for i, l := range layers {
		out[i] = layerDir(b.box, i)
		if err := b.mapDir(l, out[i], false); err != nil {
			return nil, fmt.Errorf("image layer %d: %w", i, err)
		}
	}
	return out, nil
}

// mounts makes the box's extra mounts in its range and returns them as
// binds the runtime makes: an idmapped bind of each volume's or files
// dir (read-only sources on a filesystem that cannot be idmapped are bound
// as they are: their files show as nobody), and an overlay over idmapped
// layers for each codebase.
func (b *boxIDs) mounts(ms []runtime.Mount) ([]ocibox.Bind, error) {
	out := make([]ocibox.Bind, len(ms))
	for i, m := range ms {
		dir := bindDir(b.box, i)
		out[i] = ocibox.Bind{Source: dir, Destination: m.Destination, ReadOnly: m.ReadOnly}
		if m.Codebase != nil {
			if err := b.overlay(dir, m.Codebase); err != nil {
				return nil, fmt.Errorf("mount at %s: %w", m.Destination, err)
			}
			out[i].Source = filepath.Join(dir, "merged")
			continue
		}
		src := ""
		switch {
		case m.Volume != nil:
			src = m.Volume.Dir
		case m.Files != nil:
			src = m.Files.Dir
		default:
			return nil, fmt.Errorf("mount at %s: no volume, codebase or files: %w", m.Destination, errdefs.ErrInvalidArgument)
		}
		err := b.mapDir(src, dir, true)
		if errors.Is(err, idmap.ErrNotSupported) && m.ReadOnly {
			out[i].Source = src
			continue
		}
		if errors.Is(err, idmap.ErrNotSupported) {
			return nil, fmt.Errorf("mount at %s: %w: %w", m.Destination, err, errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, fmt.Errorf("mount at %s: %w", m.Destination, err)
		}
	}
	return out, nil
}

// overlay mounts o at dir/merged over idmapped copies of its lower dir and
// of its upper's filesystem, as box root (see idmap.AsBox), with layers
// named by fd (package overlay: no host path in the box's mountinfo).
// redirect_dir, metacopy and index are off: every change is a whole file
// in o.Upper, which is what a codebase sync reads.
func (b *boxIDs) overlay(dir string, o *runtime.CodebaseMount) error {
	if filepath.Dir(o.Upper) != filepath.Dir(o.Work) {
		return fmt.Errorf("overlay upper %s and work %s: not in one dir: %w", o.Upper, o.Work, errdefs.ErrInvalidArgument)
	}
	lower, rw, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "rw"), filepath.Join(dir, "merged")
	if err := b.mapDir(o.Lower, lower, false); err != nil {
		return err
	}
	if err := b.mapDir(filepath.Dir(o.Upper), rw, false); err != nil {
		return err
	}
	if err := os.Mkdir(merged, 0o711); err != nil {
		return fmt.Errorf("create %s: %w", merged, err)
	}
	err := idmap.AsBox(b.r, func() error {
		return overlay.Mount(merged, []string{lower}, filepath.Join(rw, filepath.Base(o.Upper)),
			filepath.Join(rw, filepath.Base(o.Work)), "redirect_dir=off,metacopy=off,index=off", unix.MS_NOSUID|unix.MS_NODEV)
	})
	if err != nil {
		return err
	}
	b.undo.Add(func() error { return hostmount.Unmount(merged) })
	return nil
}

// releaseIDs frees the id range of a box whose processes are gone and
// whose dir is removed: r if known, else whatever range names box.
func (d *Driver) releaseIDs(box string, r idmap.Range) error {
	if r.Size != 0 {
		return d.ids.Release(r, box)
	}
	held, err := d.ids.Held(box)
	if err != nil {
		return err
	}
	if r, ok := held[box]; ok {
		return d.ids.Release(r, box)
	}
	return nil
}
