package image

import (
	"errors"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// FuzzRef feeds the reference checks the names users, recipes and archives
// give images. Refusals are InvalidArgument; an accepted reference parses,
// names no path that climbs ("..", empty or absolute components), and its
// canonical tag form is a fixed point.
func FuzzRef(f *testing.F) {
	for _, s := range []string{"alpine", "debian:bookworm", "registry.example.com:5000/a/b-c__d:v1.2",
		"localhost/x@sha256:" + strings.Repeat("a", 64), "../../evil:1", "x/../y", "A/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		r, err := parseRef(ref)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("parseRef(%q): %v, not InvalidArgument", ref, err)
			}
			return
		}
		repo := r.Context().RepositoryStr()
		for _, c := range strings.Split(repo, "/") {
			if c == "" || c == "." || c == ".." {
				t.Fatalf("parseRef(%q): repository %q has component %q", ref, repo, c)
			}
		}
		if reg := r.Context().RegistryStr(); strings.ContainsAny(reg, "/@") || reg == ".." {
			t.Fatalf("parseRef(%q): registry %q", ref, reg)
		}
		n, err := normalizeTag(ref)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("normalizeTag(%q): %v, not InvalidArgument", ref, err)
			}
			return
		}
		n2, err := normalizeTag(n)
		if err != nil || n2 != n {
			t.Fatalf("normalizeTag(%q) = %q, which normalizes to %q, %v", ref, n, n2, err)
		}
	})
}
