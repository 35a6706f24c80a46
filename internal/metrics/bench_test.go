package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// BenchmarkScrape is one /metrics scrape of the single-user owner (every
// series) at N sandboxes.
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{0, 100, 1000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			src := &fakeSource{}
			var obs []sandbox.Observation
			for i := range n {
				obs = append(obs, box(fmt.Sprintf("sb-%010d", i), "", 0, 0, int64(i)))
			}
			src.set(obs...)
			s := NewSampler(src, SamplerConfig{})
			m := New(Config{Sampler: s})
			s.SampleOnce(context.Background())
			h := m.Handler()
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req = req.WithContext(tenant.WithPrincipal(req.Context(), tenant.Principal{}))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				_, _ = io.Copy(io.Discard, rec.Body)
			}
		})
	}
}
