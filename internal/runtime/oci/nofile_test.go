package oci_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/runtime/oci"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
	"github.com/sbxdev/sbx/internal/testutil"
)

// TestBoxNoFileApplied checks that a box's RLIMIT_NOFILE is the one the
// driver chose for it, in the agent and in the box's processes, both with
// the file table a per-box cost and with the shared-table fallback
// (fs.file-max / 8 / pids). The runtime cannot set rlimits on a box whose
// user namespace host root does not own (prlimit needs CAP_SYS_RESOURCE
// there), so the agent sets it on itself (--nofile); without that, boxes
// kept the daemon's hard limit and the fallback bounded nothing.
func TestBoxNoFileApplied(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, tc := range []struct {
		name      string
		fileMax   int64 // 0: the host's table, as the driver found it
		pids      int64
		wantEqual uint64 // 0: BoxNoFile of the driver
	}{
		{name: "driver's own", pids: 512},
		{name: "shared table", fileMax: 8 * 64 * 3000, pids: 64, wantEqual: 3000},
		{name: "shared table at least 1024", fileMax: 8 * 64 * 10, pids: 64, wantEqual: 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, stateRoot(t))
			if tc.fileMax > 0 {
				oci.ShareFileTable(d, tc.fileMax)
			}
			want := oci.BoxNoFile(d, tc.pids)
			if tc.wantEqual != 0 && want != tc.wantEqual {
				t.Fatalf("BoxNoFile: got %d, want %d", want, tc.wantEqual)
			}
			spec := testsuite.NewSpec("nofile")
			spec.Resources.Pids = tc.pids
			h := testsuite.Create(t, d, spec)
			res := testsuite.MustExec(t, d, h, "/bin/sh", "-c",
				`ulimit -Sn; ulimit -Hn; grep "Max open files" /proc/1/limits | tr -s " " | cut -d" " -f4,5`)
			w := fmt.Sprintf("%d\n%d\n%d %d\n", want, want, want, want)
			if res.Stdout != w {
				t.Errorf("soft, hard in an exec and the agent's soft hard: got %q (%q), want %q",
					res.Stdout, strings.TrimSpace(res.Stderr), w)
			}
		})
	}
}
