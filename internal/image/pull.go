package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Progress reports the state of one layer during Pull or Import. Callbacks
// are serialised by the store.
type Progress struct {
	// Layer is the digest of the layer's compressed blob.
	Layer string
	// Status is "exists" (already stored), "fetching" (Current of Total
	// compressed bytes read and unpacked) or "done" (verified and stored).
	Status  string
	Current int64
	Total   int64
}

// maxLayers bounds the layers of one image (overlayfs stacks at most ~500
// lower dirs and Docker refuses more than 125).
const maxLayers = 128

// parallelLayers is how many layers of one image are fetched at once.
const parallelLayers = 3

// progressEvery is how often (in compressed bytes) "fetching" is reported.
const progressEvery = 4 << 20

// Pull fetches ref from its registry (credentials from the docker config
// unless Config.PullAnonymous, plain HTTP allowed for loopback registries), picking the linux image for
// this host's architecture from a multi-arch index, and stores it. A Pull
// of a ref whose pull is already under way joins it (see pullFlight): the
// image is fetched once however many callers want it at the same time.
func (s *Store) Pull(ctx context.Context, ref string, progress func(Progress)) (*Image, error) {
	r, err := parseRemoteRef(ref)
	if err != nil {
		return nil, err
	}
	return s.joinPull(ctx, r, progress)
}

// pull fetches and stores r (one pullFlight's work).
func (s *Store) pull(ctx context.Context, r name.Reference, progress func(Progress)) (*Image, error) {
	auth := remote.WithAuthFromKeychain(authn.DefaultKeychain)
	if s.cfg.PullAnonymous {
		auth = remote.WithAuth(authn.Anonymous)
	}
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithTransport(s.pullRT),
		auth,
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}),
		remote.WithUserAgent("sbx"))
	if err != nil {
		return nil, &PullError{Name: r.Name(), Err: remoteErr(err)}
	}
	src, err := remoteSource(img)
	if err != nil {
		return nil, &PullError{Name: r.Name(), Err: remoteErr(err)}
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	rec, err := s.putLocked(ctx, src, []string{r.Name()}, nil, progress)
	if err != nil {
		return nil, &PullError{Name: r.Name(), Err: remoteErr(err)}
	}
	return s.imageOf(rec, r.Name()), nil
}

// PullError is a pull that failed after its reference parsed: Name is the
// full reference asked of the registry, Err why (wrapping NotFound,
// PermissionDenied or Unavailable where the registry or network said so).
type PullError struct {
	Name string
	Err  error
}

func (e *PullError) Error() string { return "pull " + e.Name + ": " + e.Err.Error() }
func (e *PullError) Unwrap() error { return e.Err }

// parseRemoteRef parses ref, allowing plain HTTP only for loopback registries.
func parseRemoteRef(ref string) (name.Reference, error) {
	r, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	host := r.Context().RegistryStr()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return parseRef(ref, name.Insecure)
	}
	return r, nil
}

// remoteErr maps registry errors onto errdefs sentinels.
func remoteErr(err error) error {
	if refused := dialRefusal(err); refused != nil {
		return refused // the address, not every attempt at it
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
		}
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
	}
	return err
}

// source is an image to ingest, wherever it comes from.
type source struct {
	manifest []byte
	config   []byte
	// blob opens the compressed blob of a layer.
	blob func(desc v1.Descriptor) (io.ReadCloser, error)
}

func remoteSource(img v1.Image) (source, error) {
	m, err := img.RawManifest()
	if err != nil {
		return source{}, err
	}
	mf, err := img.Manifest()
	if err != nil {
		return source{}, err
	}
	if mf.Config.Size > maxMetaFile { // it is read into memory
		return source{}, fmt.Errorf("image config of %d bytes: more than %d: %w", mf.Config.Size, maxMetaFile, errdefs.ErrInvalidArgument)
	}
	c, err := img.RawConfigFile()
	if err != nil {
		return source{}, err
	}
	return source{manifest: m, config: c, blob: func(d v1.Descriptor) (io.ReadCloser, error) {
		l, err := img.LayerByDigest(d.Digest)
		if err != nil {
			return nil, err
		}
		return l.Compressed()
	}}, nil
}

// putLocked stores an image and points refs at it (see addImage for
// exclusive). The caller holds s.gc shared from before it writes anything
// to tmp/ until this returns.
func (s *Store) putLocked(ctx context.Context, src source, refs []string, exclusive map[string]bool, progress func(Progress)) (*record, error) {
	start := time.Now()
	unpacked := s.unpacked.Load()
	rec, err := s.ingestLocked(ctx, src, progress)
	if err != nil {
		return nil, err
	}
	if err := s.addImage(rec, refs, exclusive); err != nil {
		return nil, err
	}
	s.log.Info("image stored", "refs", refs, "digest", rec.Digest, "layers", len(rec.Layers),
		"unpacked", s.unpacked.Load()-unpacked, "size", rec.Size, "took", time.Since(start).Round(time.Millisecond))
	return rec, nil
}

// ingestLocked verifies and stores an image's manifest, config and layers
// and returns its record. The caller holds s.gc shared.
func (s *Store) ingestLocked(ctx context.Context, src source, progress func(Progress)) (*record, error) {
	m, err := v1.ParseManifest(bytes.NewReader(src.manifest))
	if err != nil {
		return nil, fmt.Errorf("parse manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	switch m.MediaType {
	case types.DockerManifestSchema2, types.OCIManifestSchema1, "":
	default:
		return nil, fmt.Errorf("manifest media type %q is not an image: %w", m.MediaType, errdefs.ErrInvalidArgument)
	}
	if got := digestOf(src.config); got != m.Config.Digest.String() {
		return nil, fmt.Errorf("config digest %s, manifest says %s: %w", got, m.Config.Digest, errdefs.ErrInvalidArgument)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(src.config))
	if err != nil {
		return nil, fmt.Errorf("parse image config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if (cf.OS != "" && cf.OS != "linux") || (cf.Architecture != "" && cf.Architecture != goruntime.GOARCH) {
		return nil, fmt.Errorf("image is for %s/%s, this host runs linux/%s: %w",
			cf.OS, cf.Architecture, goruntime.GOARCH, errdefs.ErrFailedPrecondition)
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("config lists %d diff_ids for %d layers: %w", len(cf.RootFS.DiffIDs), len(m.Layers), errdefs.ErrInvalidArgument)
	}
	if len(m.Layers) == 0 || len(m.Layers) > maxLayers {
		return nil, fmt.Errorf("image has %d layers; want 1 to %d: %w", len(m.Layers), maxLayers, errdefs.ErrInvalidArgument)
	}
	if m.MediaType == "" {
		m.MediaType = types.OCIManifestSchema1
	}
	rec := &record{
		Digest:       digestOf(src.manifest),
		MediaType:    string(m.MediaType),
		ConfigDigest: m.Config.Digest.String(),
		Created:      cf.Created.Time,
		Config: ImageConfig{Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
			Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd, Labels: cf.Config.Labels},
	}
	for i, l := range m.Layers {
		if err := checkLayerType(l.MediaType); err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", i, l.Digest, err)
		}
		rl := recordLayer{Digest: l.Digest.String(), DiffID: cf.RootFS.DiffIDs[i].String(), Size: l.Size, MediaType: string(l.MediaType)}
		if err := validDigest(rl.Digest); err != nil {
			return nil, err
		}
		if err := validDigest(rl.DiffID); err != nil {
			return nil, err
		}
		rec.Layers = append(rec.Layers, rl)
	}

	report := serialise(progress)
	sizes := make([]int64, len(m.Layers))
	errs := make([]error, len(m.Layers))
	sem := make(chan struct{}, parallelLayers)
	var wg sync.WaitGroup
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range m.Layers {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-lctx.Done():
				errs[i] = lctx.Err()
				return
			}
			defer func() { <-sem }()
			sizes[i], errs[i] = s.ensureLayer(lctx, rec.Layers[i], func() (io.ReadCloser, error) { return src.blob(m.Layers[i]) }, report)
			if errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	// Report the failure that made the others cancel, not a cancellation.
	var canceled error
	for i, err := range errs {
		if err == nil {
			continue
		}
		err = fmt.Errorf("layer %d (%s): %w", i, rec.Layers[i].Digest, err)
		if !errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return nil, err
		}
		if canceled == nil {
			canceled = err
		}
	}
	if canceled != nil {
		return nil, canceled
	}
	for _, n := range sizes {
		rec.Size += n
	}
	for _, b := range [][]byte{src.manifest, src.config} {
		if err := s.putBlob(b); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

func checkLayerType(mt types.MediaType) error {
	switch mt {
	case types.DockerLayer, types.OCILayer, types.OCILayerZStd, types.DockerUncompressedLayer, types.OCIUncompressedLayer:
		return nil
	}
	return fmt.Errorf("unsupported layer media type %q: %w", mt, errdefs.ErrInvalidArgument)
}

// serialise wraps a progress callback so that it is never called concurrently.
func serialise(progress func(Progress)) func(Progress) {
	if progress == nil {
		return func(Progress) {}
	}
	var mu sync.Mutex
	return func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		progress(p)
	}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// putBlob stores small content-addressed data (manifests, configs).
func (s *Store) putBlob(b []byte) error {
	p := s.blobPath(digestOf(b))
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := writeFileAtomic(p, b); err != nil {
		return fmt.Errorf("store blob: %w", err)
	}
	return nil
}

// layerMeta is what layers/<hex>.json holds.
type layerMeta struct {
	DiffID  string `json:"diff_id"`
	Size    int64  `json:"size"` // uncompressed tar bytes
	Entries int    `json:"entries"`
}

// ensureLayer makes sure the layer's blob and unpacked dir are stored,
// fetching and unpacking as needed, and returns its uncompressed size. The
// compressed stream is hashed, kept and decompressed in one pass; the
// uncompressed stream is hashed and unpacked in the same pass. Nothing is
// moved into place unless both digests match.
func (s *Store) ensureLayer(ctx context.Context, l recordLayer, open func() (io.ReadCloser, error), report func(Progress)) (int64, error) {
	unlock := s.lockLayer(hexOf(l.DiffID))
	defer unlock()

	var meta layerMeta
	haveDir := readJSON(s.layerMetaPath(l.DiffID), &meta) == nil && isDir(s.layerDir(l.DiffID))
	_, err := os.Stat(s.blobPath(l.Digest))
	haveBlob := err == nil
	if haveDir && haveBlob {
		report(Progress{Layer: l.Digest, Status: "exists", Current: l.Size, Total: l.Size})
		return meta.Size, nil
	}
	var rc io.ReadCloser
	if haveBlob { // only the unpacked dir is missing: unpack our own copy
		rc, err = os.Open(s.blobPath(l.Digest))
	} else {
		rc, err = open()
	}
	if err != nil {
		return 0, fmt.Errorf("open blob: %w", err)
	}
	defer rc.Close()

	// Compressed side: bounded by the descriptor's size, hashed, kept.
	var blobFile *os.File
	ch := sha256.New()
	sinks := []io.Writer{ch}
	if !haveBlob {
		blobFile, err = os.CreateTemp(s.tmpDir(), "blob-*")
		if err != nil {
			return 0, fmt.Errorf("store blob: %w", err)
		}
		defer os.Remove(blobFile.Name())
		defer blobFile.Close()
		sinks = append(sinks, blobFile)
	}
	cr := &meter{r: rc, w: io.MultiWriter(sinks...), limit: l.Size, what: "compressed blob", report: report, layer: l.Digest, total: l.Size}
	if l.Size <= 0 {
		cr.limit = s.cfg.MaxLayerBytes
	}
	dr, closeDecomp, err := decompress(cr)
	if err != nil {
		return 0, err
	}
	defer closeDecomp()
	// Uncompressed side: bounded by MaxLayerBytes, hashed, unpacked.
	uh := sha256.New()
	ur := &meter{r: dr, w: uh, limit: s.cfg.MaxLayerBytes, what: "uncompressed layer"}

	var tmpDir string
	var st extractStats
	if !haveDir {
		tmpDir, err = os.MkdirTemp(s.tmpDir(), "layer-"+hexOf(l.DiffID)[:12]+"-")
		if err != nil {
			return 0, fmt.Errorf("create layer dir: %w", err)
		}
		defer os.RemoveAll(tmpDir) // no-op once renamed
		st, err = extractLayer(ctx, ur, tmpDir, extractOptions{UIDShift: s.cfg.UIDShift, IDRange: s.cfg.IDRange,
			MaxBytes: s.cfg.MaxLayerBytes, Logger: s.log.With("layer", l.Digest)})
		if err != nil {
			return 0, firstErr(ur.err, cr.err, err)
		}
	}
	// Hash what follows the end of the archive too, as the digests cover it.
	if _, err := io.Copy(io.Discard, ur); err != nil {
		return 0, firstErr(ur.err, cr.err, fmt.Errorf("read layer: %w", err))
	}
	closeDecomp()
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return 0, firstErr(cr.err, fmt.Errorf("read blob: %w", err))
	}
	if got := "sha256:" + hex.EncodeToString(ch.Sum(nil)); got != l.Digest {
		return 0, fmt.Errorf("blob digest is %s, want %s: %w", got, l.Digest, errLayerRejected)
	}
	if l.Size > 0 && cr.n != l.Size {
		return 0, fmt.Errorf("blob is %d bytes, descriptor says %d: %w", cr.n, l.Size, errLayerRejected)
	}
	if got := "sha256:" + hex.EncodeToString(uh.Sum(nil)); got != l.DiffID {
		return 0, fmt.Errorf("uncompressed layer digest is %s, config says diff_id %s: %w", got, l.DiffID, errLayerRejected)
	}

	// Verified: move into place.
	if blobFile != nil {
		if err := blobFile.Close(); err != nil {
			return 0, fmt.Errorf("store blob: %w", err)
		}
		if err := os.Chmod(blobFile.Name(), 0o644); err != nil {
			return 0, fmt.Errorf("store blob: %w", err)
		}
		if err := os.Rename(blobFile.Name(), s.blobPath(l.Digest)); err != nil {
			return 0, fmt.Errorf("store blob: %w", err)
		}
	}
	if haveDir {
		report(Progress{Layer: l.Digest, Status: "done", Current: cr.n, Total: l.Size})
		return meta.Size, nil
	}
	meta = layerMeta{DiffID: l.DiffID, Size: ur.n, Entries: st.Entries}
	if err := writeJSON(s.layerMetaPath(l.DiffID), meta); err != nil {
		return 0, fmt.Errorf("write layer metadata: %w", err)
	}
	dst := s.layerDir(l.DiffID)
	if err := os.RemoveAll(dst); err != nil { // an incomplete leftover (no metadata)
		return 0, fmt.Errorf("replace layer dir: %w", err)
	}
	if err := os.Rename(tmpDir, dst); err != nil {
		return 0, fmt.Errorf("commit layer dir: %w", err)
	}
	s.unpacked.Add(1)
	report(Progress{Layer: l.Digest, Status: "done", Current: cr.n, Total: l.Size})
	return meta.Size, nil
}

// firstErr returns the first non-nil error: the meters' own errors (limits
// exceeded) explain a failure better than what the reader above saw.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// meter counts, hashes (through w) and bounds a stream, and reports progress.
type meter struct {
	r      io.Reader
	w      io.Writer
	n      int64
	limit  int64
	what   string
	err    error // set when the limit is exceeded
	report func(Progress)
	layer  string
	total  int64
	last   int64
}

func (m *meter) Read(p []byte) (int, error) {
	if m.err != nil {
		return 0, m.err
	}
	n, err := m.r.Read(p)
	if n > 0 {
		m.n += int64(n)
		if m.n > m.limit {
			m.err = fmt.Errorf("%s larger than %d bytes: %w", m.what, m.limit, errLayerRejected)
			return 0, m.err
		}
		if _, werr := m.w.Write(p[:n]); werr != nil {
			return 0, fmt.Errorf("store %s: %w", m.what, werr)
		}
		if m.report != nil && m.n-m.last >= progressEvery {
			m.last = m.n
			m.report(Progress{Layer: m.layer, Status: "fetching", Current: m.n, Total: m.total})
		}
	}
	return n, err
}

// decompress detects the compression of r by its magic number (gzip, zstd
// or none), whatever the media type claims.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 1<<20)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("read blob: %w", err)
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %v: %w", err, errLayerRejected)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// Bound the window a hostile frame may ask us to allocate.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20),
			zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %v: %w", err, errLayerRejected)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// openBlob opens a stored blob (used by export).
func (s *Store) openBlob(dgst string) (io.ReadCloser, error) {
	if err := validDigest(dgst); err != nil {
		return nil, err
	}
	f, err := os.Open(s.blobPath(dgst))
	if err != nil {
		return nil, fmt.Errorf("open blob %s: %w", dgst, err)
	}
	return f, nil
}
