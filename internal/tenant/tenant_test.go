package tenant

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbxdev/sbx/internal/errdefs"
)

func TestParse(t *testing.T) {
	h1, h2 := HashToken("token-one-0123456789"), HashToken("token-two-0123456789")
	for _, tc := range []struct {
		name, file, wantErr string
	}{
		{"ok", fmt.Sprintf(`{"tenants":[{"name":"acme","tokens":[%q],"quotas":{"max_sandboxes":3}},{"name":"b-2","tokens":[%q]}]}`, h1, h2), ""},
		{"a token instead of a hash", `{"tenants":[{"name":"acme","tokens":["token-one-0123456789"]}]}`, "is not a hash"},
		{"the secret is not echoed whole", `{"tenants":[{"name":"acme","tokens":["sbx_averylongsecretvalue"]}]}`, `"sbx_averylon..."`},
		{"short hash", `{"tenants":[{"name":"acme","tokens":["sha256:abcd"]}]}`, "is not a hash"},
		{"bad name", fmt.Sprintf(`{"tenants":[{"name":"Acme Corp","tokens":[%q]}]}`, h1), "name must match"},
		{"duplicate name", fmt.Sprintf(`{"tenants":[{"name":"a","tokens":[%q]},{"name":"a","tokens":[%q]}]}`, h1, h2), "listed twice"},
		{"shared token", fmt.Sprintf(`{"tenants":[{"name":"a","tokens":[%q]},{"name":"b","tokens":[%q]}]}`, h1, h1), "share a token"},
		{"no tokens", `{"tenants":[{"name":"a","tokens":[]}]}`, "has no tokens"},
		{"negative quota", fmt.Sprintf(`{"tenants":[{"name":"a","tokens":[%q],"quotas":{"memory_bytes":-1}}]}`, h1), "must not be negative"},
		{"unknown field", fmt.Sprintf(`{"tenants":[{"name":"a","tokens":[%q],"quota":{}}]}`, h1), "unknown field"},
		{"empty", `{"tenants":[]}`, "lists no tenants"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse([]byte(tc.file))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
				if p, ok := s.Authenticate("token-one-0123456789"); !ok || p.Tenant != "acme" || p.Quotas.MaxSandboxes != 3 {
					t.Errorf("Authenticate(token one) = %+v, %v; want acme with max_sandboxes 3", p, ok)
				}
				for _, bad := range []string{"", "token-one-012345678", h1} {
					if p, ok := s.Authenticate(bad); ok {
						t.Errorf("Authenticate(%q) = %+v; want refused (only the token itself counts, never its hash)", bad, p)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "averylongsecretvalue") {
				t.Errorf("error %q repeats the secret", err)
			}
		})
	}
}

func TestRegistryReloadKeepsOldOnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.json")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf(`{"tenants":[{"name":"a","tokens":[%q]}]}`, HashToken("token-one-0123456789")))
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	write(`{"tenants":[{"name":"a","tokens":["plain-token"]}]}`)
	if err := r.Reload(); err == nil {
		t.Fatal("reload of a bad file: got nil, want an error")
	}
	if _, ok := r.Current().Authenticate("token-one-0123456789"); !ok {
		t.Error("after a failed reload the old tenants are gone, want them kept")
	}
	write(fmt.Sprintf(`{"tenants":[{"name":"b","tokens":[%q]}]}`, HashToken("token-two-0123456789")))
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Current().Authenticate("token-one-0123456789"); ok {
		t.Error("a token removed from the file still works after the reload")
	}
	if p, ok := r.Current().Authenticate("token-two-0123456789"); !ok || p.Tenant != "b" {
		t.Errorf("new token after reload: got %+v %v, want tenant b", p, ok)
	}
}

func TestAdmitNamesTheQuota(t *testing.T) {
	q := Quotas{MaxSandboxes: 2, MemoryBytes: 100, CPUMillis: 10, DiskBytes: 5}
	used := Usage{Sandboxes: 1, MemoryBytes: 50, CPUMillis: 5, DiskBytes: 1}
	for _, tc := range []struct {
		add  Usage
		want string
	}{
		{Usage{1, 50, 5, 4}, ""},
		{Usage{2, 1, 1, 1}, "max_sandboxes"},
		{Usage{1, 51, 1, 1}, "memory_bytes"},
		{Usage{1, 1, 6, 1}, "cpu_millis"},
		{Usage{1, 1, 1, 5}, "disk_bytes"},
	} {
		err := q.Admit("t", used, tc.add)
		if tc.want == "" {
			if err != nil {
				t.Errorf("Admit(%+v): got %v, want nil", tc.add, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Admit(%+v): got %v, want ResourceExhausted naming %s", tc.add, err, tc.want)
		}
	}
	if err := (Quotas{}).Admit("t", Usage{Sandboxes: 1 << 20}, Usage{Sandboxes: 1}); err != nil {
		t.Errorf("zero quotas are unlimited: got %v", err)
	}
}

func TestAdminTokens(t *testing.T) {
	tok, admin := "token-one-0123456789", "admin-token-0123456789"
	h, ha := HashToken(tok), HashToken(admin)
	s, err := Parse(fmt.Appendf(nil, `{"tenants":[{"name":"acme","tokens":[%q]}],"admin_tokens":[%q]}`, h, ha))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := s.Authenticate(admin); !ok || !p.Admin || p.Tenant != "" {
		t.Errorf("Authenticate(admin token) = %+v, %v; want an admin of no tenant", p, ok)
	}
	if p, ok := s.Authenticate(tok); !ok || p.Admin {
		t.Errorf("Authenticate(tenant token) = %+v, %v; want acme, not an admin", p, ok)
	}
	for _, tc := range []struct{ file, want string }{
		{fmt.Sprintf(`{"tenants":[{"name":"acme","tokens":[%q]}],"admin_tokens":[%q]}`, h, admin), "admin_tokens: token"},
		{fmt.Sprintf(`{"tenants":[{"name":"acme","tokens":[%q]}],"admin_tokens":[%q]}`, h, h), "also an admin token"},
	} {
		if _, err := Parse([]byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("Parse(%s): got %v, want InvalidArgument containing %q", tc.file, err, tc.want)
		}
	}
}
