//go:build linux

package oci_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime/oci"
)

// TestNewRefusesStateDir checks the state dirs New refuses before touching
// anything, each naming what is wrong.
func TestNewRefusesStateDir(t *testing.T) {
	for _, tc := range []struct{ dir, want string }{
		{"", "must be absolute"},
		{"rel/state", "must be absolute"},
		// runc takes namespace paths as a comma-separated list.
		{"/tmp/a,b/state", "contains ','"},
	} {
		_, err := oci.New(oci.Config{StateDir: tc.dir, AgentPath: "/nonexistent"})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(state dir %q): got %v, want InvalidArgument saying %q", tc.dir, err, tc.want)
		}
	}
}
