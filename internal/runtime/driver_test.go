package runtime

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/idmap"
)

func TestStoredIDsOf(t *testing.T) {
	canon := idmap.Canonical
	other := idmap.Range{Base: 200000, Size: 65536}
	for _, tc := range []struct {
		name    string
		infos   []Info
		want    idmap.Range
		wantErr string
	}{
		{name: "none", want: idmap.Range{}},
		{name: "one", infos: []Info{{Name: "oci", StoredIDs: canon}}, want: canon},
		{name: "agree", infos: []Info{{Name: "oci", StoredIDs: canon}, {Name: "gvisor", StoredIDs: canon}}, want: canon},
		{name: "zero skipped", infos: []Info{{Name: "fake"}, {Name: "oci", StoredIDs: canon}}, want: canon},
		{name: "disagree", infos: []Info{{Name: "oci", StoredIDs: canon}, {Name: "vm", StoredIDs: other}},
			wantErr: `runtimes "oci" and "vm" store trees in different uid ranges (100000-165535 and 200000-265535)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StoredIDsOf(tc.infos...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("StoredIDsOf: got error %v, want FailedPrecondition saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("StoredIDsOf = %v, %v; want %v, nil", got, err, tc.want)
			}
		})
	}
}

// TestDriversImportedOnlyByDaemon: the layers above the drivers (the
// stores, the manager, the server) know no driver, so a driver's
// properties (its uid mapping, its paths) reach them only through the
// contract, as the daemon wires them.
func TestDriversImportedOnlyByDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	pkgs := []string{"image", "codebase", "volume", "sandbox", "server", "builder", "hostimage", "idmap"}
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}"}
	for _, p := range pkgs {
		args = append(args, "../"+p)
	}
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/sbxdev/sbx/internal/runtime/") && !strings.HasSuffix(pkg, "/runtime/testsuite") {
			t.Errorf("one of %v depends on the driver package %s; only internal/daemon may", pkgs, pkg)
		}
	}
}

func TestDecodeHandle(t *testing.T) {
	type data struct {
		V   int    `json:"v"`
		Dir string `json:"dir"`
	}
	for _, tc := range []struct {
		name    string
		raw     string
		wantV   int
		want    data
		wantErr error
	}{
		{name: "no data", raw: "", wantV: 0},
		{name: "unversioned", raw: `{"dir":"/x"}`, wantV: 0, want: data{Dir: "/x"}},
		{name: "current", raw: `{"v":2,"dir":"/y"}`, wantV: 2, want: data{V: 2, Dir: "/y"}},
		{name: "older", raw: `{"v":1,"dir":"/z"}`, wantV: 1, want: data{V: 1, Dir: "/z"}},
		{name: "newer", raw: `{"v":3,"dir":"/w"}`, wantV: 3, wantErr: ErrHandleVersion},
		{name: "negative", raw: `{"v":-1}`, wantV: -1, wantErr: ErrHandleVersion},
		{name: "garbage", raw: `{"v":`, wantErr: errdefs.ErrInvalidArgument},
		{name: "wrong type", raw: `{"v":1,"dir":5}`, wantV: 1, wantErr: errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, v, err := DecodeHandle[data](Handle{ID: "b", Driver: "d", Data: []byte(tc.raw)}, 2)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || v != tc.wantV {
					t.Fatalf("DecodeHandle(%s) = %d, %v; want %d, %v", tc.raw, v, err, tc.wantV, tc.wantErr)
				}
				if got != (data{}) {
					t.Fatalf("DecodeHandle(%s) filled %+v on error", tc.raw, got)
				}
				return
			}
			if err != nil || v != tc.wantV || got != tc.want {
				t.Fatalf("DecodeHandle(%s) = %d, %+v, %v; want %d, %+v, nil", tc.raw, v, got, err, tc.wantV, tc.want)
			}
		})
	}
}
