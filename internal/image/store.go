// Package image owns OCI images on disk: pull from registries, import and
// export of tarballs, the layer store and its garbage collection. It turns an
// image reference into the list of unpacked layer directories that
// runtime.Image.Layers wants (lowest first, stacked read-only by overlayfs).
// It imports nothing from sbx but leaf packages (errdefs, atomicfile); the daemon wires it in.
//
// On-disk layout under Config.Dir (one Store per directory, enforced with a
// lock file):
//
//	index.json              refs ("index.docker.io/library/alpine:latest") → manifest digest
//	images/<hex>.json       one record per image, named by its manifest digest
//	blobs/sha256/<hex>      manifests, configs and compressed layer blobs (for Export)
//	layers/<hex>/           an unpacked layer, named by its diffID; an overlayfs lower dir
//	layers/<hex>.json       that layer's metadata; written before the dir is renamed in
//	tmp/                    work in progress, emptied by Open
//
// Every metadata file is written to a temp file and renamed into place. A
// layer is unpacked once, into tmp/, verified (compressed digest and diffID),
// then renamed into layers/; images sharing a layer share its directory.
// Layers are only deleted by Prune. See extract.go for how hostile layer
// content is made harmless.
package image

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sbxdev/sbx/internal/atomicfile"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// Config configures a Store.
type Config struct {
	// Dir holds everything the store keeps. Its ancestors must be searchable
	// by the mapped uids, since layer dirs are overlayfs lower dirs of boxes.
	Dir    string
	Logger *slog.Logger
	// UIDShift is the host uid (and gid) of sandbox uid 0, e.g. 100000:
	// files owned by uid u in the image are owned by UIDShift+u on disk.
	UIDShift uint32
	// IDRange is how many ids are mapped (default 65536); ids beyond it
	// become the overflow id UIDShift+65534.
	IDRange uint32
	// MaxLayerBytes bounds the uncompressed size of one layer (default 8 GiB).
	MaxLayerBytes int64
	// MaxArchiveBytes bounds an imported archive, which is spooled to disk
	// before it is read (default 32 GiB).
	MaxArchiveBytes int64
	// PullAddrs, when set, is asked about every address a pull is about
	// to connect to (the registry, its redirects, its token realm); an
	// error refuses the connection and fails the pull with it. Tenants'
	// stores get PublicOnly (dial.go).
	PullAddrs func(netip.Addr) error
	// PullAnonymous pulls without credentials. Otherwise pulls use the
	// daemon's docker config (the host user's `docker login`s), which is
	// the operator's: tenants' stores pull anonymously unless the operator
	// shares them (--tenant-pull-credentials).
	PullAnonymous bool
}

// DefaultMaxLayerBytes is Config.MaxLayerBytes's default.
const DefaultMaxLayerBytes = 8 << 30

// DefaultMaxArchiveBytes is Config.MaxArchiveBytes's default.
const DefaultMaxArchiveBytes = 32 << 30

// Image is a stored image, ready to run.
type Image struct {
	// Ref is the normalised reference the image was found by (or its first
	// tag when found by digest; "" for an untagged image).
	Ref string
	// Digest is the manifest digest, "sha256:<hex>".
	Digest string
	// Layers are the absolute dirs of the unpacked layers, lowest first.
	Layers []string
	// DiffIDs are the layers' uncompressed digests ("sha256:<hex>"), in
	// the same order.
	DiffIDs []string
	Config  ImageConfig
	// Size is the uncompressed size of all layers.
	Size    int64
	Created time.Time
}

// ImageConfig is the part of an image's config a sandbox honours.
type ImageConfig struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Store is the on-disk image store. It is safe for concurrent use.
type Store struct {
	cfg  Config
	log  *slog.Logger
	lock *os.File // flock on Dir/lock
	// pullRT is the transport of pulls (pullTransport: checked by
	// cfg.PullAddrs).
	pullRT http.RoundTripper

	// gc is held shared by operations that add content (pull, import,
	// export) and exclusively by Prune.
	gc sync.RWMutex

	layerMu sync.Mutex
	// layerLocks serialises work on one layer (keyed by diffID hex) so that
	// concurrent pulls of the same layer unpack it once.
	layerLocks map[string]*keyLock

	// unpacked counts layers unpacked since Open (tests, metrics).
	unpacked atomic.Int64

	// pullMu guards pulls: the pull of each normalised ref under way, which
	// later Pulls of the same ref join (see pullflight.go).
	pullMu sync.Mutex
	pulls  map[string]*pullFlight

	// mu guards the fields below and the index and record files.
	mu      sync.Mutex
	refs    map[string]string  // normalised ref → manifest digest
	records map[string]*record // manifest digest → record
	leases  map[*Lease]map[string]bool
}

// record is what images/<hex>.json holds.
type record struct {
	Digest       string        `json:"digest"`
	MediaType    string        `json:"media_type"`
	ConfigDigest string        `json:"config_digest"`
	Layers       []recordLayer `json:"layers"`
	Config       ImageConfig   `json:"config"`
	Size         int64         `json:"size"`
	Created      time.Time     `json:"created"`
	// Intermediate marks build steps' images: hidden from List while
	// untagged, forgotten by Prune (see commit.go).
	Intermediate bool `json:"intermediate,omitempty"`
}

type recordLayer struct {
	Digest    string `json:"digest"` // of the compressed blob
	DiffID    string `json:"diff_id"`
	Size      int64  `json:"size"` // of the compressed blob
	MediaType string `json:"media_type"`
}

type indexFile struct {
	Version int               `json:"version"`
	Refs    map[string]string `json:"refs"`
}

// Open opens (creating if needed) the store in cfg.Dir.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("image store dir %q must be an absolute path: %w", cfg.Dir, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsAny(cfg.Dir, ",:") {
		return nil, fmt.Errorf("image store dir %q contains ',' or ':' (unusable in overlayfs options): %w", cfg.Dir, errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.IDRange == 0 {
		cfg.IDRange = 65536
	}
	if cfg.MaxLayerBytes <= 0 {
		cfg.MaxLayerBytes = DefaultMaxLayerBytes
	}
	if cfg.MaxArchiveBytes <= 0 {
		cfg.MaxArchiveBytes = DefaultMaxArchiveBytes
	}
	s := &Store{cfg: cfg, log: cfg.Logger, pullRT: pullTransport(cfg.PullAddrs), layerLocks: map[string]*keyLock{}, pulls: map[string]*pullFlight{}, refs: map[string]string{}, records: map[string]*record{}}
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("create image store: %w", err)
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("lock image store: %w", errors.Join(err, errdefs.ErrUnavailable))
	}
	s.lock = lock
	// Layer dirs are lower dirs of boxes: they must be reachable by mapped
	// uids (o+x), but their listing is nobody's business.
	for _, d := range []string{"images", "blobs/sha256", "layers"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o711); err != nil {
			lock.Close()
			return nil, fmt.Errorf("create image store: %w", err)
		}
	}
	if err := os.Chmod(filepath.Join(cfg.Dir, "layers"), 0o711); err != nil {
		lock.Close()
		return nil, fmt.Errorf("create image store: %w", err)
	}
	// Leftovers of interrupted work; we hold the lock, so nobody uses them.
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		lock.Close()
		return nil, fmt.Errorf("clean image store tmp: %w", err)
	}
	if err := os.Mkdir(s.tmpDir(), 0o700); err != nil {
		lock.Close()
		return nil, fmt.Errorf("create image store: %w", err)
	}
	if os.Geteuid() != 0 {
		s.log.Warn("image store not running as root: unpacking layers (shifted owners, whiteout devices) will fail")
	}
	for p := cfg.Dir; ; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			s.log.Warn("image store dir is not searchable by others; boxes with mapped uids cannot use its layers", "dir", p)
			break
		}
		if p == "/" {
			break
		}
	}
	if err := s.load(); err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the store's directory lock.
func (s *Store) Close() error { return s.lock.Close() }

func (s *Store) tmpDir() string    { return filepath.Join(s.cfg.Dir, "tmp") }
func (s *Store) indexPath() string { return filepath.Join(s.cfg.Dir, "index.json") }
func (s *Store) recordPath(dgst string) string {
	return filepath.Join(s.cfg.Dir, "images", hexOf(dgst)+".json")
}
func (s *Store) blobPath(dgst string) string {
	return filepath.Join(s.cfg.Dir, "blobs", "sha256", hexOf(dgst))
}
func (s *Store) layerDir(diffID string) string {
	return filepath.Join(s.cfg.Dir, "layers", hexOf(diffID))
}
func (s *Store) layerMetaPath(diffID string) string {
	return filepath.Join(s.cfg.Dir, "layers", hexOf(diffID)+".json")
}

// hexOf returns the hex part of "sha256:<hex>".
func hexOf(dgst string) string { return strings.TrimPrefix(dgst, "sha256:") }

func (s *Store) load() error {
	var idx indexFile
	if err := readJSON(s.indexPath(), &idx); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read image index: %w", err)
	}
	ents, err := os.ReadDir(filepath.Join(s.cfg.Dir, "images"))
	if err != nil {
		return fmt.Errorf("read image records: %w", err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		var r record
		if err := readJSON(filepath.Join(s.cfg.Dir, "images", e.Name()), &r); err != nil {
			s.log.Warn("ignoring unreadable image record", "file", e.Name(), "err", err)
			continue
		}
		s.records[r.Digest] = &r
	}
	for ref, dgst := range idx.Refs {
		// Stores written before refs were checked may hold names taken
		// from archives, such as "../../evil:1": they are forgotten.
		if n, err := normalize(ref); err != nil || n != ref {
			s.log.Warn("dropping an invalid image ref", "ref", quoteRef(ref), "digest", dgst)
			continue
		}
		if s.records[dgst] == nil {
			s.log.Warn("dropping ref to a missing image", "ref", ref, "digest", dgst)
			continue
		}
		s.refs[ref] = dgst
	}
	return nil
}

// writeIndexLocked persists s.refs.
func (s *Store) writeIndexLocked() error {
	return writeJSON(s.indexPath(), indexFile{Version: 1, Refs: s.refs})
}

// addImage records rec and points refs at it. A ref in exclusive that
// names another image already fails with errdefs.ErrAlreadyExists before
// anything is written.
func (s *Store) addImage(rec *record, refs []string, exclusive map[string]bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range refs {
		if d, ok := s.refs[r]; ok && d != rec.Digest && exclusive[r] {
			return fmt.Errorf("%s names another image already (replace it explicitly): %w", r, errdefs.ErrAlreadyExists)
		}
	}
	if err := writeJSON(s.recordPath(rec.Digest), rec); err != nil {
		return fmt.Errorf("write image record: %w", err)
	}
	s.records[rec.Digest] = rec
	for _, r := range refs {
		s.refs[r] = rec.Digest
	}
	if err := s.writeIndexLocked(); err != nil {
		return fmt.Errorf("write image index: %w", err)
	}
	return nil
}

// normalize turns a user's reference into its canonical form
// ("alpine" → "index.docker.io/library/alpine:latest").
// It refuses what the distribution spec's grammar does not allow (see
// checkRef).
func normalize(ref string) (string, error) {
	r, err := parseRef(ref)
	if err != nil {
		return "", err
	}
	return r.Name(), nil
}

// resolveLocked finds an image by reference or by (prefix of) its digest.
// It returns the ref to report (see Image.Ref).
func (s *Store) resolveLocked(ref string) (*record, string, error) {
	if n, err := normalize(ref); err == nil {
		if d, ok := s.refs[n]; ok {
			return s.records[d], n, nil
		}
	}
	if hex, ok := digestPrefix(ref); ok {
		var found *record
		for d, r := range s.records {
			if strings.HasPrefix(hexOf(d), hex) {
				if found != nil {
					return nil, "", fmt.Errorf("image %q: ambiguous digest prefix: %w", ref, errdefs.ErrInvalidArgument)
				}
				found = r
			}
		}
		if found != nil {
			return found, s.firstRefLocked(found.Digest), nil
		}
	}
	return nil, "", fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
}

// digestPrefix reports whether ref looks like a digest or a prefix of one
// (at least 4 hex digits, "sha256:" optional) and returns the hex part.
func digestPrefix(ref string) (string, bool) {
	hex := strings.TrimPrefix(ref, "sha256:")
	if len(hex) < 4 || len(hex) > 64 {
		return "", false
	}
	for _, c := range hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return hex, true
}

func (s *Store) refsOfLocked(dgst string) []string {
	var out []string
	for r, d := range s.refs {
		if d == dgst {
			out = append(out, r)
		}
	}
	slices.Sort(out)
	return out
}

func (s *Store) firstRefLocked(dgst string) string {
	if refs := s.refsOfLocked(dgst); len(refs) > 0 {
		return refs[0]
	}
	return ""
}

func (s *Store) imageOf(r *record, ref string) *Image {
	img := &Image{Ref: ref, Digest: r.Digest, Config: r.Config, Size: r.Size, Created: r.Created}
	img.Config.Env = slices.Clone(r.Config.Env)
	img.Config.Entrypoint = slices.Clone(r.Config.Entrypoint)
	img.Config.Cmd = slices.Clone(r.Config.Cmd)
	img.Config.Labels = maps.Clone(r.Config.Labels)
	for _, l := range r.Layers {
		img.Layers = append(img.Layers, s.layerDir(l.DiffID))
		img.DiffIDs = append(img.DiffIDs, l.DiffID)
	}
	return img
}

// Get returns a stored image by reference ("alpine" ==
// "index.docker.io/library/alpine:latest") or by a prefix of its manifest
// digest. It fails with errdefs.ErrNotFound when there is none.
func (s *Store) Get(ctx context.Context, ref string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, n, err := s.resolveLocked(ref)
	if err != nil {
		return nil, err
	}
	s.leaseLocked(ctx, r.Digest)
	return s.imageOf(r, n), nil
}

// List returns one entry per ref, plus one per untagged image (but for
// untagged intermediate images of builds), sorted by ref.
func (s *Store) List(ctx context.Context) ([]*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Image
	tagged := map[string]bool{}
	for ref, d := range s.refs {
		out = append(out, s.imageOf(s.records[d], ref))
		tagged[d] = true
	}
	for d, r := range s.records {
		if !tagged[d] && !r.Intermediate {
			out = append(out, s.imageOf(r, ""))
		}
	}
	slices.SortFunc(out, func(a, b *Image) int {
		return strings.Compare(a.Ref+" "+a.Digest, b.Ref+" "+b.Digest)
	})
	return out, nil
}

// Tag makes dst refer to the image src refers to.
func (s *Store) Tag(ctx context.Context, src, dst string) error {
	n, err := normalizeTag(dst)
	if err != nil {
		return fmt.Errorf("tag: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, _, err := s.resolveLocked(src)
	if err != nil {
		return err
	}
	s.refs[n] = r.Digest
	return s.writeIndexLocked()
}

// Remove untags an image: by reference it drops that ref; by digest it drops
// every ref of the image. An image left without refs is forgotten; its
// layers and blobs stay on disk until Prune.
func (s *Store) Remove(ctx context.Context, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, n, err := s.resolveLocked(ref)
	if err != nil {
		return err
	}
	if nn, err := normalize(ref); err == nil && s.refs[nn] == r.Digest {
		delete(s.refs, n)
	} else {
		for _, rr := range s.refsOfLocked(r.Digest) {
			delete(s.refs, rr)
		}
	}
	if err := s.writeIndexLocked(); err != nil {
		return fmt.Errorf("write image index: %w", err)
	}
	if len(s.refsOfLocked(r.Digest)) == 0 {
		delete(s.records, r.Digest)
		if err := os.Remove(s.recordPath(r.Digest)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove image record: %w", err)
		}
	}
	return nil
}

// keyLock is a reference-counted mutex in Store.layerLocks.
type keyLock struct {
	mu   sync.Mutex
	refs int
}

// lockLayer serialises work on one layer; call the returned func to unlock.
func (s *Store) lockLayer(key string) func() {
	s.layerMu.Lock()
	l := s.layerLocks[key]
	if l == nil {
		l = &keyLock{}
		s.layerLocks[key] = l
	}
	l.refs++
	s.layerMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.layerMu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.layerLocks, key)
		}
		s.layerMu.Unlock()
	}
}

// readJSON decodes the JSON file p into v.
func readJSON(p string, v any) error { return atomicfile.ReadJSON(p, v) }

// writeJSON atomically replaces p with v encoded as JSON.
func writeJSON(p string, v any) error { return atomicfile.WriteJSON(p, v) }

// writeFileAtomic atomically replaces p with b (mode 0644).
func writeFileAtomic(p string, b []byte) error { return atomicfile.WriteFile(p, b, 0o644) }

// validDigest checks a "sha256:<64 hex>" digest (anything else could name a
// path outside the store).
func validDigest(d string) error {
	h, err := v1.NewHash(d)
	if err != nil || h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return fmt.Errorf("digest %q: not sha256:<64 hex>: %w", d, errdefs.ErrInvalidArgument)
	}
	if _, ok := digestPrefix(h.Hex); !ok {
		return fmt.Errorf("digest %q: not lowercase hex: %w", d, errdefs.ErrInvalidArgument)
	}
	return nil
}
