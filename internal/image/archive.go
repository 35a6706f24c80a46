package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// maxMetaFile bounds manifests, configs and index files read from archives.
const maxMetaFile = 16 << 20

// ImportOptions says which names an import gives the images it stores.
//
// Names inside an archive (a docker-save manifest's RepoTags, an OCI
// layout's io.containerd.image.name and org.opencontainers.image.ref.name
// annotations) are chosen by whoever made the archive, so they are never
// applied unless the caller asks: by default they are only reported
// (ImportResult.ArchiveTags), and the images are named by Tags alone.
type ImportOptions struct {
	// Tags name the archive's image (an archive holding more than one is
	// refused when Tags is set). Each must be a valid tag reference
	// (checkRef), or the import fails before reading the archive. A tag
	// that names another image already is moved to the imported one, as
	// Tag does: the caller chose it.
	Tags []string
	// UseArchiveTags applies the archive's own names as well. Each must be
	// a valid tag reference: the import fails, naming it, if one is not.
	// A name that already belongs to another image fails the import with
	// errdefs.ErrAlreadyExists, before anything is stored, unless
	// ReplaceArchiveTags.
	UseArchiveTags     bool
	ReplaceArchiveTags bool
	// Progress (may be nil) sees each layer's progress.
	Progress func(Progress)
}

// ImportResult is one image an import stored.
type ImportResult struct {
	Image *Image
	// ArchiveTags are the valid names the archive gives the image,
	// normalised; they were applied only with UseArchiveTags.
	ArchiveTags []string
	// RejectedTags are names the archive gives the image that are not
	// valid tag references, quoted (and cut) for display; never applied.
	RejectedTags []string
}

// maxReportedNames bounds the archive names reported per image: an
// archive may carry any number.
const maxReportedNames = 16

// Import stores the images of a tarball: an OCI image layout (index.json +
// oci-layout + blobs/, as `docker save` writes since Docker 25 and skopeo,
// crane and buildkit can) or a classic `docker save` archive (manifest.json).
// An archive with both is read as an OCI layout, which keeps manifests
// byte for byte. For a classic archive the manifest is rebuilt (Docker
// schema 2), as `docker load` does. The images are named as opts says; an
// image without a name is stored untagged and found by digest.
func (s *Store) Import(ctx context.Context, r io.Reader, opts ImportOptions) ([]ImportResult, error) {
	var userRefs []string
	for _, t := range opts.Tags {
		n, err := normalizeTag(t)
		if err != nil {
			return nil, fmt.Errorf("import: --tag: %w", err)
		}
		userRefs = append(userRefs, n)
	}
	s.gc.RLock()
	defer s.gc.RUnlock()
	// The archive is spooled to disk: its members come in any order.
	f, err := os.CreateTemp(s.tmpDir(), "import-*")
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n, err := io.Copy(f, io.LimitReader(r, s.cfg.MaxArchiveBytes+1))
	if err != nil {
		return nil, fmt.Errorf("import: read archive: %w", err)
	}
	if n > s.cfg.MaxArchiveBytes {
		return nil, fmt.Errorf("import: archive is larger than the limit of %d bytes: %w", s.cfg.MaxArchiveBytes, errdefs.ErrInvalidArgument)
	}
	ar, err := indexArchive(f)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	type found struct {
		src   source
		names []string // as the archive spells them: hostile
	}
	var imgs []found
	switch {
	case ar.has("index.json") && ar.has("oci-layout"):
		idx, err := ar.readJSON("index.json")
		if err != nil {
			return nil, fmt.Errorf("import: %w", err)
		}
		var im v1.IndexManifest
		if err := json.Unmarshal(idx, &im); err != nil {
			return nil, fmt.Errorf("import: parse index.json: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		for _, d := range im.Manifests {
			src, err := ar.layoutImage(d, 0)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", d.Digest, err)
			}
			imgs = append(imgs, found{src, layoutNames(d)})
		}
	case ar.has("manifest.json"):
		b, err := ar.readJSON("manifest.json")
		if err != nil {
			return nil, fmt.Errorf("import: %w", err)
		}
		var m tarball.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("import: parse manifest.json: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		for _, d := range m {
			src, err := ar.dockerImage(d)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", quoteRef(d.Config), err)
			}
			imgs = append(imgs, found{src, d.RepoTags})
		}
	default:
		return nil, fmt.Errorf("import: neither an OCI layout nor a docker-save archive: %w", errdefs.ErrInvalidArgument)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import: archive holds no image: %w", errdefs.ErrInvalidArgument)
	}
	if len(userRefs) > 0 && len(imgs) != 1 {
		return nil, fmt.Errorf("import: --tag needs an archive with one image, this one has %d: %w", len(imgs), errdefs.ErrInvalidArgument)
	}
	// Sort the archive's names into valid and not, and check (before
	// storing anything) what applying them would do.
	out := make([]ImportResult, len(imgs))
	refs := make([][]string, len(imgs))
	claimed := map[string]string{} // archive tag → digest of the image claiming it
	for i, fi := range imgs {
		refs[i] = slices.Clone(userRefs)
		dgst := digestOf(fi.src.manifest)
		for _, name := range fi.names {
			t, err := normalizeTag(name)
			if err != nil {
				if opts.UseArchiveTags {
					return nil, fmt.Errorf("import: archive name: %w", err)
				}
				if len(out[i].RejectedTags) < maxReportedNames {
					out[i].RejectedTags = append(out[i].RejectedTags, quoteRef(name))
				}
				continue
			}
			if slices.Contains(out[i].ArchiveTags, t) {
				continue
			}
			if len(out[i].ArchiveTags) < maxReportedNames {
				out[i].ArchiveTags = append(out[i].ArchiveTags, t)
			}
			if !opts.UseArchiveTags {
				continue
			}
			if d, ok := claimed[t]; ok && d != dgst {
				return nil, fmt.Errorf("import: the archive gives %s to two images: %w", t, errdefs.ErrInvalidArgument)
			}
			claimed[t] = dgst
			if !slices.Contains(refs[i], t) {
				refs[i] = append(refs[i], t)
			}
		}
	}
	exclusive := map[string]bool{} // archive tags that may not move an existing tag
	if opts.UseArchiveTags && !opts.ReplaceArchiveTags {
		s.mu.Lock()
		for t, d := range claimed {
			if slices.Contains(userRefs, t) {
				continue // the caller named it too
			}
			exclusive[t] = true
			if cur, ok := s.refs[t]; ok && cur != d {
				s.mu.Unlock()
				return nil, fmt.Errorf("import: the archive names its image %s, which names another image already (replace it explicitly): %w", t, errdefs.ErrAlreadyExists)
			}
		}
		s.mu.Unlock()
	}
	for i, fi := range imgs {
		rec, err := s.putLocked(ctx, fi.src, refs[i], exclusive, opts.Progress)
		if err != nil {
			return out[:i], fmt.Errorf("import: %w", err)
		}
		out[i].Image = s.imageOf(rec, firstOr(refs[i], ""))
	}
	return out, nil
}

// layoutNames returns the names an image of an OCI layout has in its
// annotations. A bare ref.name ("latest") names no repository and is not
// one.
func layoutNames(d v1.Descriptor) []string {
	var out []string
	for _, k := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
		if v, ok := d.Annotations[k]; ok && strings.ContainsAny(v, "/:@") {
			out = append(out, v)
		}
	}
	return out
}

// archive is a random-access view of a spooled tar: regular files by name.
type archive struct {
	f     *os.File
	files map[string]archiveFile
}

type archiveFile struct {
	off, size int64
	link      string // symlink target, resolved relative to the archive root
}

// indexArchive reads the tar headers of f. Names are only map keys here:
// nothing is written to disk.
func indexArchive(f *os.File) (*archive, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	cr := &countReader{r: bufio.NewReaderSize(f, 64<<10)}
	tr := tar.NewReader(cr)
	a := &archive{f: f, files: map[string]archiveFile{}}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return a, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read archive: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		n := path.Clean("/" + hdr.Name)[1:]
		switch hdr.Typeflag {
		case tar.TypeReg:
			a.files[n] = archiveFile{off: cr.n, size: hdr.Size}
		case tar.TypeSymlink, tar.TypeLink: // old docker-save archives link duplicate layers
			t := hdr.Linkname
			if hdr.Typeflag == tar.TypeSymlink && !path.IsAbs(t) {
				t = path.Join(path.Dir("/"+n), t)
			}
			a.files[n] = archiveFile{link: path.Clean("/" + t)[1:]}
		}
	}
}

func (a *archive) has(name string) bool { _, ok := a.files[name]; return ok }

// open returns a reader of the named member, following links.
func (a *archive) open(name string) (io.ReadCloser, int64, error) {
	name = path.Clean("/" + name)[1:]
	for range 10 {
		m, ok := a.files[name]
		if !ok {
			return nil, 0, fmt.Errorf("archive has no %q: %w", name, errdefs.ErrInvalidArgument)
		}
		if m.link == "" {
			return io.NopCloser(io.NewSectionReader(a.f, m.off, m.size)), m.size, nil
		}
		name = m.link
	}
	return nil, 0, fmt.Errorf("archive member %q: too many links: %w", name, errdefs.ErrInvalidArgument)
}

func (a *archive) readJSON(name string) ([]byte, error) {
	r, size, err := a.open(name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if size > maxMetaFile {
		return nil, fmt.Errorf("archive member %q is %d bytes, more than %d: %w", name, size, maxMetaFile, errdefs.ErrInvalidArgument)
	}
	return io.ReadAll(r)
}

func (a *archive) blobName(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// layoutImage resolves a descriptor of an OCI layout to an image, picking
// linux/GOARCH from nested indexes.
func (a *archive) layoutImage(d v1.Descriptor, depth int) (source, error) {
	if depth > 4 {
		return source{}, fmt.Errorf("indexes nested too deep: %w", errdefs.ErrInvalidArgument)
	}
	if err := validDigest(d.Digest.String()); err != nil {
		return source{}, err
	}
	b, err := a.readJSON(a.blobName(d.Digest))
	if err != nil {
		return source{}, err
	}
	if digestOf(b) != d.Digest.String() {
		return source{}, fmt.Errorf("manifest %s does not match its digest: %w", d.Digest, errLayerRejected)
	}
	if d.MediaType.IsIndex() {
		im, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return source{}, fmt.Errorf("parse index: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		for _, c := range im.Manifests {
			if c.Platform == nil || c.Platform.OS == "linux" && c.Platform.Architecture == goruntime.GOARCH {
				if c.MediaType.IsImage() {
					return a.layoutImage(c, depth+1)
				}
			}
		}
		return source{}, fmt.Errorf("no linux/%s image in index: %w", goruntime.GOARCH, errdefs.ErrNotFound)
	}
	m, err := v1.ParseManifest(bytes.NewReader(b))
	if err != nil {
		return source{}, fmt.Errorf("parse manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := validDigest(m.Config.Digest.String()); err != nil {
		return source{}, err
	}
	cfg, err := a.readJSON(a.blobName(m.Config.Digest))
	if err != nil {
		return source{}, err
	}
	return source{manifest: b, config: cfg, blob: func(d v1.Descriptor) (io.ReadCloser, error) {
		if err := validDigest(d.Digest.String()); err != nil {
			return nil, err
		}
		r, _, err := a.open(a.blobName(d.Digest))
		return r, err
	}}, nil
}

// dockerImage turns one entry of a docker-save manifest.json into an image,
// building the Docker schema-2 manifest docker load would (layer digests are
// computed from the archive members; ingest verifies them again).
func (a *archive) dockerImage(d tarball.Descriptor) (source, error) {
	cfg, err := a.readJSON(d.Config)
	if err != nil {
		return source{}, err
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.DockerManifestSchema2,
		Config: v1.Descriptor{MediaType: types.DockerConfigJSON, Size: int64(len(cfg)), Digest: mustHash(digestOf(cfg))}}
	files := map[string]string{}
	for _, p := range d.Layers {
		r, _, err := a.open(p)
		if err != nil {
			return source{}, err
		}
		h, size, err := v1.SHA256(r)
		if err != nil {
			r.Close()
			return source{}, fmt.Errorf("hash %s: %w", p, err)
		}
		r.Close()
		mt, err := a.layerMediaType(p)
		if err != nil {
			return source{}, err
		}
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: mt, Size: size, Digest: h})
		files[h.String()] = p
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return source{}, err
	}
	return source{manifest: raw, config: cfg, blob: func(d v1.Descriptor) (io.ReadCloser, error) {
		r, _, err := a.open(files[d.Digest.String()])
		return r, err
	}}, nil
}

// layerMediaType names a layer by its compression, as seen in its first bytes.
func (a *archive) layerMediaType(p string) (types.MediaType, error) {
	r, _, err := a.open(p)
	if err != nil {
		return "", err
	}
	defer r.Close()
	magic := make([]byte, 4)
	n, _ := io.ReadFull(r, magic)
	switch {
	case bytes.HasPrefix(magic[:n], []byte{0x1f, 0x8b}):
		return types.DockerLayer, nil
	case bytes.HasPrefix(magic[:n], []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return types.OCILayerZStd, nil
	}
	return types.DockerUncompressedLayer, nil
}

func mustHash(d string) v1.Hash {
	h, err := v1.NewHash(d)
	if err != nil {
		panic(err)
	}
	return h
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Export writes a stored image as a `docker save` archive (tarball.Write):
// config and compressed layer blobs as stored, and a manifest.json naming
// the image by ref when ref is a tag, or by all its tags when ref is a
// digest. The archive does not carry the original manifest: importing it
// rebuilds a Docker schema-2 manifest, which has the same digest when the
// image came with one (the usual case) and a new one otherwise (an OCI
// manifest); the config digest and layers are always preserved.
func (s *Store) Export(ctx context.Context, ref string, w io.Writer) error {
	s.gc.RLock()
	defer s.gc.RUnlock()
	s.mu.Lock()
	rec, n, err := s.resolveLocked(ref)
	var tags []string
	if err == nil {
		if nn, nerr := normalize(ref); nerr == nil && s.refs[nn] == rec.Digest {
			tags = []string{nn}
		} else {
			tags = s.refsOfLocked(rec.Digest)
		}
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	img, err := s.storedImage(rec)
	if err != nil {
		return fmt.Errorf("export %s: %w", n, err)
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		if tag, err := name.NewTag(t); err == nil {
			refs[tag] = img
		}
	}
	if len(refs) == 0 { // untagged, or only digest refs: no RepoTags
		d, err := name.NewDigest("sbx.invalid/untagged@" + rec.Digest)
		if err != nil {
			return fmt.Errorf("export %s: %w", rec.Digest, err)
		}
		refs[d] = img
	}
	if err := tarball.MultiRefWrite(refs, &ctxWriter{ctx, w}); err != nil {
		return fmt.Errorf("export %s: %w", n, err)
	}
	return nil
}

// ctxWriter stops a long export when ctx is done.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// storedImage is a stored image as a v1.Image, backed by the blob store.
func (s *Store) storedImage(rec *record) (v1.Image, error) {
	read := func(d string) ([]byte, error) {
		r, err := s.openBlob(d)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return io.ReadAll(io.LimitReader(r, maxMetaFile))
	}
	m, err := read(rec.Digest)
	if err != nil {
		return nil, err
	}
	c, err := read(rec.ConfigDigest)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&blobImage{s: s, rec: rec, manifest: m, config: c})
}

// blobImage implements partial.CompressedImageCore over the blob store.
type blobImage struct {
	s                *Store
	rec              *record
	manifest, config []byte
}

func (b *blobImage) RawConfigFile() ([]byte, error) { return b.config, nil }
func (b *blobImage) RawManifest() ([]byte, error)   { return b.manifest, nil }
func (b *blobImage) MediaType() (types.MediaType, error) {
	return types.MediaType(b.rec.MediaType), nil
}

func (b *blobImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range b.rec.Layers {
		if l.Digest == h.String() {
			return &blobLayer{s: b.s, l: l}, nil
		}
	}
	return nil, fmt.Errorf("blob %s is not a layer of %s: %w", h, b.rec.Digest, errdefs.ErrNotFound)
}

// blobLayer implements partial.CompressedLayer over a stored blob.
type blobLayer struct {
	s *Store
	l recordLayer
}

func (b *blobLayer) Digest() (v1.Hash, error)            { return v1.NewHash(b.l.Digest) }
func (b *blobLayer) Compressed() (io.ReadCloser, error)  { return b.s.openBlob(b.l.Digest) }
func (b *blobLayer) Size() (int64, error)                { return b.l.Size, nil }
func (b *blobLayer) MediaType() (types.MediaType, error) { return types.MediaType(b.l.MediaType), nil }
