//go:build linux

package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/hostimage"
	"github.com/sbxdev/sbx/internal/runtime/oci"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// Boxes' user namespaces are made by the small helper when it lies beside
// the agent (installed under the state dir, where the box's root can run
// it), and by the agent binary when it does not; either way the box works
// and its root is root inside.
func TestNSHelper(t *testing.T) {
	testutil.RequiresRoot(t)
	agent := testutil.AgentBinary(t)
	for _, tc := range []struct {
		name       string
		withHelper bool
	}{{"beside the agent", true}, {"absent: the agent", false}} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			if err := os.Chmod(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := hostimage.CopyFile(agent, filepath.Join(bin, "sbx-agent"), 0o755); err != nil {
				t.Fatal(err)
			}
			if tc.withHelper {
				if err := hostimage.CopyFile(filepath.Join(filepath.Dir(agent), oci.NSHelperName), filepath.Join(bin, oci.NSHelperName), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			dir := stateRoot(t)
			d, err := oci.New(oci.Config{StateDir: dir, AgentPath: filepath.Join(bin, "sbx-agent"), CgroupParent: cgroupParent(dir)})
			if err != nil {
				t.Fatal(err)
			}
			got := oci.NSHelper(d)
			if isHelper := filepath.Base(got) == oci.NSHelperName && strings.HasPrefix(got, dir+"/"); isHelper != tc.withHelper {
				t.Errorf("user namespace helper: got %s, want the helper under the state dir: %v", got, tc.withHelper)
			}
			h := testsuite.Create(t, d, testsuite.NewSpec("nshelper"))
			if out := testsuite.MustExec(t, d, h, "id", "-u").Stdout; strings.TrimSpace(out) != "0" {
				t.Errorf("id -u in the box: got %q, want 0", out)
			}
			if err := d.Destroy(context.Background(), h); err != nil {
				t.Fatal(err)
			}
		})
	}
}
