//go:build linux

package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// downloadMiBps is the baseline measured by BenchmarkPull/download, for the
// ratio BenchmarkPull/pull reports.
var downloadMiBps float64

// BenchmarkPull pulls a ~100 MiB image of random data (4 layers of 5 files)
// from a loopback registry into a fresh store, next to a baseline that only
// downloads the same blobs with net/http (as many at once as Pull does).
//
//	go test -run '^$' -bench Pull -benchtime 5x ./internal/image/
func BenchmarkPull(b *testing.B) {
	reg := startRegistry(b, nil)
	var layers []v1.Layer
	var uncompressed, compressed int64
	for range 4 {
		var ents []ent
		for j := range 5 {
			body := make([]byte, 5<<20)
			rand.Read(body)
			ents = append(ents, file(fmt.Sprintf("data/f%d", j), string(body)))
		}
		data := tarOf(b, ents...)
		uncompressed += int64(len(data))
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
			tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			b.Fatal(err)
		}
		compressed += must(l.Size())
		layers = append(layers, l)
	}
	ref := reg + "/sbx/bench:v1"
	push(b, ref, imageOf(b, layers...))

	b.Run("download", func(b *testing.B) {
		b.SetBytes(compressed)
		var spent time.Duration
		for b.Loop() {
			start := time.Now()
			var wg sync.WaitGroup
			sem := make(chan struct{}, parallelLayers)
			for _, l := range layers {
				d := must(l.Digest())
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					resp, err := http.Get("http://" + reg + "/v2/sbx/bench/blobs/" + d.String())
					if err != nil {
						b.Error(err)
						return
					}
					defer resp.Body.Close()
					if _, err := io.Copy(io.Discard, resp.Body); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			spent += time.Since(start)
		}
		downloadMiBps = float64(compressed) / (1 << 20) / (spent.Seconds() / float64(b.N))
		b.ReportMetric(downloadMiBps, "MiB/s")
	})

	b.Run("pull", func(b *testing.B) {
		s := openStore(b, b.TempDir())
		b.SetBytes(uncompressed)
		var spent time.Duration
		for b.Loop() {
			b.StopTimer()
			// Start from an empty store each time.
			s.Close()
			if err := os.RemoveAll(s.cfg.Dir); err != nil {
				b.Fatal(err)
			}
			s = openStore(b, filepath.Join(b.TempDir(), "store"))
			b.StartTimer()
			start := time.Now()
			if _, err := s.Pull(context.Background(), ref, nil); err != nil {
				b.Fatal(err)
			}
			spent += time.Since(start)
		}
		mibps := float64(uncompressed) / (1 << 20) / (spent.Seconds() / float64(b.N))
		b.ReportMetric(mibps, "MiB/s")
		if downloadMiBps > 0 {
			b.ReportMetric(mibps/downloadMiBps, "x-download")
		}
	})
}
