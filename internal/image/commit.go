package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Images made here (snapshots, build steps) get a proper OCI config and
// manifest on top of their base: rootfs.diff_ids and history extended by
// the new layer, the given ImageConfig. The new layer is stored like a
// pulled one (gzip blob under blobs/, unpacked once by the same extractor
// into layers/<diffID>), so export, prune and sandboxes treat it alike.
//
// An empty layer (a tar without entries) is not added on top of a base that
// has layers: the new image is the base's layers with the new config and a
// history entry marked empty_layer. An image without a base always gets its
// layer, empty or not.

// LayerDesc describes one stored layer of an image.
type LayerDesc struct {
	// Digest is the digest of the compressed blob, Size its length.
	Digest    string `json:"digest"`
	DiffID    string `json:"diff_id"`
	Size      int64  `json:"size"`
	MediaType string `json:"media_type"`
}

// ImageSpec says how to make a new image on top of a base.
type ImageSpec struct {
	// Config replaces the base's config (the caller starts from the base's).
	Config ImageConfig
	// CreatedBy is the history entry of the new layer, e.g. "sbx snapshot".
	CreatedBy string
	// Created is the image's creation time (zero: now). Builders pass the
	// time a cached step first ran, so that the same steps give the same
	// manifest digest.
	Created time.Time
	// Tag, if set, names the new image.
	Tag string
	// Intermediate images (build steps) are left out of List while untagged
	// and forgotten by Prune.
	Intermediate bool
}

// Commit stores layer (an uncompressed layer tar) as a new layer on top of
// base (an image reference or digest; "" for none) and makes an image of it
// with config cfg, tagged tag (untagged if "").
func (s *Store) Commit(ctx context.Context, base string, layer io.Reader, cfg ImageConfig, tag string) (*Image, error) {
	return s.CommitSpec(ctx, base, layer, ImageSpec{Config: cfg, Tag: tag, CreatedBy: "sbx snapshot"})
}

// CommitSpec is Commit with every option.
func (s *Store) CommitSpec(ctx context.Context, base string, layer io.Reader, spec ImageSpec) (*Image, error) {
	if _, err := refsOf(spec.Tag); err != nil {
		return nil, err
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	baseRec, err := s.baseRecord(base)
	if err != nil {
		return nil, err
	}
	desc, err := s.addLayerLocked(ctx, layer, baseRec == nil || len(baseRec.Layers) == 0)
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	var layers []LayerDesc
	if desc != nil {
		layers = append(layers, *desc)
	}
	return s.composeLocked(ctx, baseRec, layers, spec)
}

// Compose makes an image of base plus already stored layers (as LayersOf
// or a build cache gives them) without unpacking anything. It fails with
// errdefs.ErrNotFound when a layer is no longer stored.
func (s *Store) Compose(ctx context.Context, base string, layers []LayerDesc, spec ImageSpec) (*Image, error) {
	if _, err := refsOf(spec.Tag); err != nil {
		return nil, err
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	baseRec, err := s.baseRecord(base)
	if err != nil {
		return nil, err
	}
	return s.composeLocked(ctx, baseRec, layers, spec)
}

// LayersOf returns the layers of a stored image, lowest first.
func (s *Store) LayersOf(ctx context.Context, ref string) ([]LayerDesc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, _, err := s.resolveLocked(ref)
	if err != nil {
		return nil, err
	}
	out := make([]LayerDesc, len(r.Layers))
	for i, l := range r.Layers {
		out[i] = LayerDesc(l)
	}
	return out, nil
}

func refsOf(tag string) ([]string, error) {
	if tag == "" {
		return nil, nil
	}
	n, err := normalizeTag(tag)
	if err != nil {
		return nil, fmt.Errorf("tag: %w", err)
	}
	return []string{n}, nil
}

func (s *Store) baseRecord(base string) (*record, error) {
	if base == "" {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, _, err := s.resolveLocked(base)
	if err != nil {
		return nil, fmt.Errorf("base image: %w", err)
	}
	return r, nil
}

// addLayerLocked stores an uncompressed layer tar: it is hashed (diffID) and
// gzipped into a blob (digest) in one pass, the blob is moved into place and
// ensureLayer unpacks it (once per diffID). With keepEmpty false a layer
// without entries is not stored and nil is returned. The caller holds s.gc.
func (s *Store) addLayerLocked(ctx context.Context, r io.Reader, keepEmpty bool) (*LayerDesc, error) {
	f, err := os.CreateTemp(s.tmpDir(), "commit-*")
	if err != nil {
		return nil, fmt.Errorf("store layer: %w", err)
	}
	defer os.Remove(f.Name()) // no-op once renamed
	defer f.Close()
	ch := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, ch)}
	gz, err := gzip.NewWriterLevel(cw, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	uh := sha256.New()
	ur := &meter{r: r, w: io.MultiWriter(uh, gz), limit: s.cfg.MaxLayerBytes, what: "layer"}
	tr := tar.NewReader(ur)
	entries := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		_, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, firstErr(ur.err, fmt.Errorf("read layer tar after %d entries: %v: %w", entries, err, errLayerRejected))
		}
		entries++
	}
	if _, err := io.Copy(io.Discard, ur); err != nil { // hashed too
		return nil, firstErr(ur.err, fmt.Errorf("read layer: %w", err))
	}
	if entries == 0 && !keepEmpty {
		return nil, nil
	}
	if err := gz.Close(); err != nil {
		return nil, fmt.Errorf("compress layer: %w", err)
	}
	desc := &LayerDesc{
		Digest: "sha256:" + hex.EncodeToString(ch.Sum(nil)), DiffID: "sha256:" + hex.EncodeToString(uh.Sum(nil)),
		Size: cw.n, MediaType: string(types.OCILayer),
	}
	// We made the blob ourselves: it is placed before ensureLayer, which
	// then unpacks (and verifies) that copy instead of asking for one.
	if _, err := os.Stat(s.blobPath(desc.Digest)); err != nil {
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("store layer: %w", err)
		}
		if err := os.Chmod(f.Name(), 0o644); err != nil {
			return nil, fmt.Errorf("store layer: %w", err)
		}
		if err := os.Rename(f.Name(), s.blobPath(desc.Digest)); err != nil {
			return nil, fmt.Errorf("store layer: %w", err)
		}
	}
	start, unpacked := time.Now(), s.unpacked.Load()
	if _, err := s.ensureLayer(ctx, recordLayer(*desc), func() (io.ReadCloser, error) {
		return s.openBlob(desc.Digest)
	}, func(Progress) {}); err != nil {
		return nil, err
	}
	s.log.Debug("layer committed", "diff_id", desc.DiffID, "entries", entries, "blob_bytes", desc.Size,
		"unpacked", s.unpacked.Load()-unpacked, "took", time.Since(start).Round(time.Millisecond))
	return desc, nil
}

// composeLocked writes config, manifest and record of base + layers. An
// image that already exists (the same manifest) is only tagged. The caller
// holds s.gc.
func (s *Store) composeLocked(ctx context.Context, base *record, layers []LayerDesc, spec ImageSpec) (*Image, error) {
	refs, err := refsOf(spec.Tag)
	if err != nil {
		return nil, err
	}
	cf := &v1.ConfigFile{}
	mediaType := types.OCIManifestSchema1
	var baseLayers []LayerDesc
	if base != nil {
		b, err := s.readBlob(base.ConfigDigest)
		if err != nil {
			return nil, fmt.Errorf("read base config: %w", err)
		}
		if cf, err = v1.ParseConfigFile(bytes.NewReader(b)); err != nil {
			return nil, fmt.Errorf("parse base config: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if base.MediaType == string(types.DockerManifestSchema2) {
			mediaType = types.DockerManifestSchema2
		}
		for _, l := range base.Layers {
			baseLayers = append(baseLayers, LayerDesc(l))
		}
	}
	created := spec.Created
	if created.IsZero() {
		created = time.Now()
	}
	created = created.UTC().Truncate(time.Second)
	c := spec.Config
	cf.OS, cf.Architecture, cf.Created = "linux", goruntime.GOARCH, v1.Time{Time: created}
	cf.Config.Env, cf.Config.WorkingDir, cf.Config.User = slices.Clone(c.Env), c.WorkingDir, c.User
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Labels = slices.Clone(c.Entrypoint), slices.Clone(c.Cmd), c.Labels
	cf.RootFS.Type = "layers"
	for _, l := range layers {
		h, err := v1.NewHash(l.DiffID)
		if err != nil {
			return nil, fmt.Errorf("layer diff_id %q: %w", l.DiffID, errdefs.ErrInvalidArgument)
		}
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, h)
		cf.History = append(cf.History, v1.History{Created: cf.Created, CreatedBy: spec.CreatedBy, Comment: "sbx"})
	}
	if len(layers) == 0 {
		cf.History = append(cf.History, v1.History{Created: cf.Created, CreatedBy: spec.CreatedBy, Comment: "sbx", EmptyLayer: true})
	}
	cfgRaw, err := json.Marshal(cf)
	if err != nil {
		return nil, fmt.Errorf("encode image config: %w", err)
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: mediaType,
		Config: v1.Descriptor{MediaType: types.OCIConfigJSON, Size: int64(len(cfgRaw)), Digest: mustHash(digestOf(cfgRaw))}}
	if mediaType == types.DockerManifestSchema2 {
		m.Config.MediaType = types.DockerConfigJSON
	}
	for _, l := range append(baseLayers, layers...) {
		h, err := v1.NewHash(l.Digest)
		if err != nil {
			return nil, fmt.Errorf("layer digest %q: %w", l.Digest, errdefs.ErrInvalidArgument)
		}
		mt := types.MediaType(l.MediaType)
		if mediaType == types.DockerManifestSchema2 && mt == types.OCILayer {
			mt = types.DockerLayer // the same gzip tar, named as the manifest's kind expects
		}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: mt, Size: l.Size, Digest: h})
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	dgst := digestOf(raw)
	s.mu.Lock()
	existing := s.records[dgst]
	if existing != nil {
		s.leaseLocked(ctx, dgst)
	}
	s.mu.Unlock()
	if existing != nil {
		if err := s.addImage(existing, refs, nil); err != nil {
			return nil, err
		}
		return s.imageOf(existing, firstOr(refs, "")), nil
	}
	for _, l := range layers {
		if err := validDigest(l.Digest); err != nil {
			return nil, err
		}
	}
	rec, err := s.ingestLocked(ctx, source{manifest: raw, config: cfgRaw, blob: func(d v1.Descriptor) (io.ReadCloser, error) {
		r, err := s.openBlob(d.Digest.String())
		if err != nil {
			return nil, fmt.Errorf("layer %s is no longer stored: %w", d.Digest, errdefs.ErrNotFound)
		}
		return r, nil
	}}, nil)
	if err != nil {
		return nil, err
	}
	rec.Intermediate = spec.Intermediate
	if err := s.addImage(rec, refs, nil); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.leaseLocked(ctx, rec.Digest)
	s.mu.Unlock()
	return s.imageOf(rec, firstOr(refs, "")), nil
}

func firstOr(refs []string, def string) string {
	if len(refs) > 0 {
		return refs[0]
	}
	return def
}

// readBlob reads a small stored blob (a config or manifest).
func (s *Store) readBlob(dgst string) ([]byte, error) {
	r, err := s.openBlob(dgst)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, maxMetaFile))
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
