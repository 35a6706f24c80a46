package network

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestHostLock(t *testing.T) {
	dir := t.TempDir()
	first := Config{LockDir: dir, Bridge: "sbx0", Table: "sbx", StateDir: "/var/lib/first/network"}
	l, err := lockHost(first)
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	for _, tt := range []struct {
		name          string
		bridge, table string
		wantErr       string // "" = the lock is taken
	}{
		{"same bridge and table", "sbx0", "sbx", `network bridge "sbx0" is in use by another sbx daemon`},
		{"same bridge", "sbx0", "other", `network bridge "sbx0" is in use`},
		{"same table", "sbx1", "sbx", `network table "sbx" is in use`},
		{"neither", "sbx1", "other", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l2, err := lockHost(Config{LockDir: dir, Bridge: tt.bridge, Table: tt.table, StateDir: "/var/lib/second/network"})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("got %v, want the lock", err)
				}
				l2.release()
				return
			}
			if err == nil {
				l2.release()
				t.Fatalf("second daemon got the lock, want %q", tt.wantErr)
			}
			msg := err.Error()
			for _, want := range []string{tt.wantErr, "pid " + strconv.Itoa(os.Getpid()), "/var/lib/first/network"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not say %q", msg, want)
				}
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) {
				t.Errorf("error %v is not FailedPrecondition", err)
			}
		})
	}
	// A failed attempt must not have taken (or kept) the bridge lock while
	// failing on the table: after the first daemon goes, both are free.
	l.release()
	l3, err := lockHost(Config{LockDir: dir, Bridge: "sbx0", Table: "sbx", StateDir: "/var/lib/third/network"})
	if err != nil {
		t.Fatalf("lock after the first daemon released it: %v", err)
	}
	l3.release()
}
