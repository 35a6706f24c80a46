package ocibox

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

func TestEtcFiles(t *testing.T) {
	hosts := func(h string) string {
		return "127.0.0.1\tlocalhost " + h + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	}
	for _, tc := range []struct {
		name    string
		spec    runtime.Spec
		want    map[string]string
		wantErr error
	}{
		{name: "id as hostname", spec: runtime.Spec{ID: "b1"},
			want: map[string]string{"etc/hostname": "b1\n", "etc/hosts": hosts("b1")}},
		{name: "hostname and dns", spec: runtime.Spec{ID: "b1", Hostname: "h", Network: &runtime.Network{DNS: []string{"10.0.0.1", "::1"}}},
			want: map[string]string{"etc/hostname": "h\n", "etc/hosts": hosts("h"), "etc/resolv.conf": "nameserver 10.0.0.1\nnameserver ::1\n"}},
		{name: "bad dns", spec: runtime.Spec{ID: "b1", Network: &runtime.Network{DNS: []string{"x\nnameserver 6.6.6.6"}}}, wantErr: errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := EtcFiles(tc.spec)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("EtcFiles: got %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("EtcFiles (-want +got):\n%s", diff)
			}
		})
	}
}
