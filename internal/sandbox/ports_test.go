package sandbox

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseProcNetTCP(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []ListeningPort
	}{
		{"ipv4", `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
`, []ListeningPort{{8080, "127.0.0.1"}, {80, "0.0.0.0"}}},
		{"ipv6", `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1 0 100 0 0 10 0
`, []ListeningPort{{8081, "::"}, {22, "::1"}}},
		{"empty", "  sl  local_address rem_address   st\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProcNetTCP(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("ports (-want +got):\n%s", d)
			}
		})
	}
}

func TestDedupePorts(t *testing.T) {
	got := dedupePorts([]ListeningPort{{8080, "127.0.0.1"}, {80, "::"}, {8080, "0.0.0.0"}, {80, "0.0.0.0"}})
	want := []ListeningPort{{80, "0.0.0.0"}, {8080, "0.0.0.0"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
