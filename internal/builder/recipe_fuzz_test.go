package builder

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// fuzzStep makes a recipe step of kind k (mod 10) from two strings.
func fuzzStep(k uint8, a, b string) *sbxv1.RecipeStep {
	switch k % 10 {
	case 0:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Run{Run: a}}
	case 1:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Workdir{Workdir: a}}
	case 2:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_User{User: a}}
	case 3:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: map[string]string{a: b}}}}
	case 4:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Entrypoint{Entrypoint: &sbxv1.StringList{Values: []string{a, b}}}}
	case 5:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Cmd{Cmd: &sbxv1.StringList{Values: []string{a, b}}}}
	case 6:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_AptInstall{AptInstall: &sbxv1.PackageList{Packages: []string{a, b}}}}
	case 7:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_PipInstall{PipInstall: &sbxv1.PackageList{Packages: []string{a, b}}}}
	case 8:
		return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_NpmInstall{NpmInstall: &sbxv1.PackageList{Packages: []string{a}}}}
	}
	return &sbxv1.RecipeStep{Step: &sbxv1.RecipeStep_Copy{Copy: &sbxv1.CopyStep{Dest: a, Tar: []byte(b)}}}
}

// FuzzStepKey feeds validation and the build cache key the steps a build
// request carries. Refusals are InvalidArgument; two valid steps share a
// cache key only if they are the same step (else one would reuse the
// other's cached layer), a copy's tar compared by content.
func FuzzStepKey(f *testing.F) {
	f.Add(uint8(0), "make install", "", uint8(0), "make  install", "")
	f.Add(uint8(3), "A", "b=c", uint8(3), "A=b", "c")
	f.Add(uint8(4), "a", "b", uint8(5), "a", "b")
	f.Add(uint8(6), "x", "y", uint8(7), "x", "y")
	f.Add(uint8(1), "/app", "", uint8(2), "/app", "")
	f.Fuzz(func(t *testing.T, k1 uint8, a1, b1 string, k2 uint8, a2, b2 string) {
		s1, s2 := fuzzStep(k1, a1, b1), fuzzStep(k2, a2, b2)
		for _, s := range []*sbxv1.RecipeStep{s1, s2} {
			if err := validate(&sbxv1.Recipe{From: "debian", Steps: []*sbxv1.RecipeStep{s}}); err != nil {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("validate: %v, not InvalidArgument", err)
				}
				return
			}
			_ = describe(s)
			_ = command(s)
		}
		if k1%10 == 9 && k2%10 == 9 {
			return // copies: equal keys for equal tar content, tested elsewhere
		}
		if stepKey("p", s1) == stepKey("p", s2) && !proto.Equal(s1, s2) {
			t.Fatalf("different steps share a cache key:\n%v\n%v\ncanonical %s", s1, s2, canonical(s1))
		}
	})
}
