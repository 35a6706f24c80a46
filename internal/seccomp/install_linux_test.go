package seccomp

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// TestInstallRefusesBadLengths checks the argument checks that run before
// anything touches the process (the real installation is tested in a child
// process by TestKernel).
func TestInstallRefusesBadLengths(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
	}{
		{"empty", 0},
		{"too long", MaxInstructions + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Install(make([]unix.SockFilter, tc.n))
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("got %v, want an ErrInvalidArgument", err)
			}
		})
	}
}
