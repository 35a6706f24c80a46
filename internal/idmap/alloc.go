package idmap

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// DefaultDir is where ranges are recorded host-wide: a tmpfs, so a reboot
// (which ends every box) frees them all.
const DefaultDir = "/run/sbx/idmap"

// Allocator hands out the ranges of a Pool. A taken range is a file named
// after its slot in Dir, created with O_EXCL (so daemons over different
// state dirs never hand out the same range) and holding its owner's name
// (a box dir). Nothing is kept in memory: a daemon that restarts finds its
// ranges where it left them.
type Allocator struct {
	dir  string
	pool Pool
}

// NewAllocator returns an Allocator recording in dir ("" = DefaultDir).
func NewAllocator(dir string, pool Pool) (*Allocator, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if err := pool.check(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create id range dir: %w", err)
	}
	return &Allocator{dir: dir, pool: pool}, nil
}

func (a *Allocator) file(slot uint32) string {
	return filepath.Join(a.dir, strconv.FormatUint(uint64(slot), 10))
}

// Allocate takes a free range for owner (an absolute path naming what uses
// it). It starts at a random slot so that ranges freed a moment ago are not
// the first handed out again. The owner is written to a temporary file first
// and linked to the slot's name (link fails if the name exists), so a slot
// file always names its owner: a crash cannot leave a taken slot that no
// daemon recognises as its own.
func (a *Allocator) Allocate(owner string) (Range, error) {
	if !filepath.IsAbs(owner) || strings.ContainsRune(owner, '\n') {
		return Range{}, fmt.Errorf("id range owner %q: want an absolute path: %w", owner, errdefs.ErrInvalidArgument)
	}
	tmp, err := os.CreateTemp(a.dir, tmpPrefix)
	if err != nil {
		return Range{}, fmt.Errorf("take id range: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(owner)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Range{}, fmt.Errorf("take id range: %w", err)
	}
	start := rand.Uint32N(a.pool.Slots)
	for n := uint32(0); n < a.pool.Slots; n++ {
		slot := (start + n) % a.pool.Slots
		err := os.Link(tmp.Name(), a.file(slot))
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return Range{}, fmt.Errorf("take id range: %w", err)
		}
		return a.pool.slot(slot), nil
	}
	return Range{}, fmt.Errorf("all %d id ranges are taken: %w", a.pool.Slots, errdefs.ErrResourceExhausted)
}

// tmpPrefix names Allocate's temporary files; Held removes those a crash
// left behind.
const tmpPrefix = ".new-"

// Owner returns who holds r ("" if nobody).
func (a *Allocator) Owner(r Range) (string, error) {
	slot, err := a.pool.index(r)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(a.file(slot))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read id range owner: %w", err)
	}
	return string(b), nil
}

// Release frees r if owner holds it. Call it only once nothing runs with r's
// ids any more.
func (a *Allocator) Release(r Range, owner string) error {
	got, err := a.Owner(r)
	if err != nil || got != owner {
		return err
	}
	slot, _ := a.pool.index(r)
	if err := os.Remove(a.file(slot)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("free id range %v: %w", r, err)
	}
	return nil
}

// Held lists the ranges whose owner is under dir (dir itself or below it),
// by owner.
func (a *Allocator) Held(dir string) (map[string]Range, error) {
	ents, err := os.ReadDir(a.dir)
	if err != nil {
		return nil, fmt.Errorf("list id ranges: %w", err)
	}
	dir = filepath.Clean(dir)
	out := map[string]Range{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(filepath.Join(a.dir, e.Name())) // left by a crash mid-Allocate
			}
			continue
		}
		slot, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || uint32(slot) >= a.pool.Slots {
			continue
		}
		b, err := os.ReadFile(filepath.Join(a.dir, e.Name()))
		if err != nil {
			continue
		}
		if o := string(b); o == dir || strings.HasPrefix(o, dir+"/") {
			out[o] = a.pool.slot(uint32(slot))
		}
	}
	return out, nil
}

// SweepMinAge is how old a slot must be before Sweep may free it: longer
// than any create takes between taking a range and making what uses it.
const SweepMinAge = 10 * time.Minute

// Sweep frees the ranges whose owner is gone and that nothing uses, on the
// whole host: a slot is freed only if its owner path no longer exists (a
// box dir removed, or the data dir of a daemon that is gone, which no
// daemon's own Cleanup looks at), the slot is older than minAge, and no
// process on the host has a uid or gid in its range, real, effective,
// saved or filesystem (read from procDir/<pid>/status, "" = /proc, twice,
// so a process that forked and exited between two reads is seen in one of
// them). A box whose dir was deleted under it while it runs keeps its
// range: its processes hold its ids. It returns the owners it freed.
func (a *Allocator) Sweep(procDir string, minAge time.Duration) ([]string, error) {
	if procDir == "" {
		procDir = "/proc"
	}
	ents, err := os.ReadDir(a.dir)
	if err != nil {
		return nil, fmt.Errorf("list id ranges: %w", err)
	}
	type cand struct {
		r     Range
		owner string
		slot  string
	}
	var cands []cand
	for _, e := range ents {
		slot, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || uint32(slot) >= a.pool.Slots {
			continue
		}
		path := filepath.Join(a.dir, e.Name())
		info, err := os.Lstat(path)
		if err != nil || time.Since(info.ModTime()) < minAge {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) == 0 || !filepath.IsAbs(string(b)) {
			continue
		}
		owner := string(b)
		if _, err := os.Lstat(owner); !errors.Is(err, os.ErrNotExist) {
			continue // there (or not known to be gone)
		}
		cands = append(cands, cand{r: a.pool.slot(uint32(slot)), owner: owner, slot: path})
	}
	if len(cands) == 0 {
		return nil, nil
	}
	var used []uint32
	for range 2 {
		ids, err := processIDs(procDir)
		if err != nil {
			return nil, err
		}
		used = append(used, ids...)
	}
	var freed []string
	var errs []error
	for _, c := range cands {
		busy := false
		for _, id := range used {
			if c.r.Contains(id) {
				busy = true
				break
			}
		}
		if busy {
			continue
		}
		if err := a.Release(c.r, c.owner); err != nil {
			errs = append(errs, err)
			continue
		}
		freed = append(freed, c.owner)
	}
	return freed, errors.Join(errs...)
}

// processIDs lists every uid and gid (real, effective, saved, filesystem)
// of every process under procDir.
func processIDs(procDir string) ([]uint32, error) {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []uint32
	for _, e := range ents {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "status"))
		if err != nil {
			continue // exited meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			rest, ok := strings.CutPrefix(line, "Uid:")
			if !ok {
				rest, ok = strings.CutPrefix(line, "Gid:")
			}
			if !ok {
				continue
			}
			for _, f := range strings.Fields(rest) {
				if id, err := strconv.ParseUint(f, 10, 32); err == nil {
					out = append(out, uint32(id))
				}
			}
		}
	}
	return out, nil
}
