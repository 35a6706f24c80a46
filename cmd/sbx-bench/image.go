package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// benchImage measures cold creates from a five-layer image against cold
// creates from the host image, interleaved so both see the same machine.
func benchImage(ctx context.Context, c *sbx.Client, tmp string, n int) (host, img result, err error) {
	ref := "bench/layers:5"
	tarPath := filepath.Join(tmp, "layers.tar")
	if err := writeLayeredImage(tarPath, ref); err != nil {
		return host, img, err
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return host, img, err
	}
	defer f.Close()
	if _, err := c.Images().Import(ctx, f, ref); err != nil {
		return host, img, fmt.Errorf("import bench image: %w", err)
	}
	host.name = "sbx create→ready, host image (cold)"
	img.name = "sbx create→ready, 5-layer image (cold)"
	for range n {
		for _, r := range []*result{&host, &img} {
			opts := sbx.CreateOptions{}
			if r == &img {
				opts.Image = ref
			}
			one, err := measure(r.name, 1, func() error {
				sb, err := c.Create(ctx, opts)
				if err == nil {
					defer func() { _ = sb.Destroy(ctx) }()
				}
				return err
			})
			if err != nil {
				return host, img, err
			}
			r.ds = append(r.ds, one.ds...)
		}
	}
	return host, img, nil
}

// writeLayeredImage writes a docker-save tarball of an image with a shell and
// its libraries in the first layer and four more layers of files on top.
func writeLayeredImage(path, ref string) error {
	libc, _ := filepath.EvalSymlinks("/lib/x86_64-linux-gnu/libc.so.6")
	ld, _ := filepath.EvalSymlinks("/lib64/ld-linux-x86-64.so.2")
	base := []tarEntry{
		{"bin", "->usr/bin", nil}, {"lib", "->usr/lib", nil}, {"lib64", "->usr/lib64", nil},
		{"usr/bin/dash", "", hostFile("/usr/bin/dash")}, {"usr/bin/sh", "->dash", nil},
		{"usr/lib/x86_64-linux-gnu/libc.so.6", "", hostFile(libc)},
		{"usr/lib64/ld-linux-x86-64.so.2", "", hostFile(ld)},
		{"etc/passwd", "", []byte("root:x:0:0:root:/root:/bin/sh\n")}, {"tmp/", "", nil}, {"root/", "", nil},
	}
	layers := []v1.Layer{}
	l, err := layerOf(base)
	if err != nil {
		return err
	}
	layers = append(layers, l)
	for i := range 4 {
		var es []tarEntry
		for j := range 200 {
			es = append(es, tarEntry{fmt.Sprintf("opt/l%d/f%03d", i, j), "", bytes.Repeat([]byte{byte('a' + i)}, 4096)})
		}
		l, err := layerOf(es)
		if err != nil {
			return err
		}
		layers = append(layers, l)
	}
	im, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return err
	}
	cf, err := im.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/bin:/bin"}
	if im, err = mutate.ConfigFile(im, cf); err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(path, tag, im)
}

type tarEntry struct {
	name, link string
	body       []byte
}

func hostFile(p string) []byte {
	b, _ := os.ReadFile(p)
	return b
}

func layerOf(entries []tarEntry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.name[len(e.name)-1] == '/':
			hdr.Typeflag, hdr.Size = tar.TypeDir, 0
		case len(e.link) > 2 && e.link[:2] == "->":
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, e.link[2:], 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}
