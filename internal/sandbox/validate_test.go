package sandbox

import (
	"fmt"
	"strings"
	"testing"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

var testLimits = Limits{
	MinMemoryBytes: 16 << 20, MaxMemoryBytes: 8 << 30, MinCPUMillis: 10, MaxCPUMillis: 2000,
	MinPids: 16, MaxPids: 16384, MinDiskBytes: 1 << 20, MaxDiskBytes: 1 << 40, MaxTimeoutMs: 3600_000,
}

func manyStrings(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("K%d", i)] = "v"
	}
	return m
}

func slicesRepeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestValidateCreate(t *testing.T) {
	tests := []struct {
		name    string
		req     *sbxv1.CreateSandboxRequest
		wantErr string // substring; "" means valid
	}{
		{"empty is fine", &sbxv1.CreateSandboxRequest{}, ""},
		{"good name", &sbxv1.CreateSandboxRequest{Name: "web-1.a_b"}, ""},
		{"bad name", &sbxv1.CreateSandboxRequest{Name: "no spaces"}, `name "no spaces"`},
		{"name too long", &sbxv1.CreateSandboxRequest{Name: strings.Repeat("a", 64)}, "name"},
		{"name like an id", &sbxv1.CreateSandboxRequest{Name: "sb-abcdefabcdef"}, "looks like a sandbox id"},
		{"bad label key", &sbxv1.CreateSandboxRequest{Labels: map[string]string{"a b": "x"}}, "label key"},
		{"control char in label", &sbxv1.CreateSandboxRequest{Labels: map[string]string{"a": "x\n"}}, "label"},
		{"bad env key", &sbxv1.CreateSandboxRequest{Env: map[string]string{"1X": "y"}}, `env name "1X"`},
		{"nul in env", &sbxv1.CreateSandboxRequest{Env: map[string]string{"X": "a\x00b"}}, "NUL"},
		{"env and secret clash", &sbxv1.CreateSandboxRequest{Env: map[string]string{"K": "1"}, Secrets: map[string]string{"K": "2"}}, "both"},
		{"relative workdir", &sbxv1.CreateSandboxRequest{Workdir: "work"}, "workdir"},
		{"memory too small", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 1}}, "memory 1B: below the minimum of 16MiB"},
		{"memory too big", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{MemoryBytes: 1 << 40}}, "memory 1TiB: above"},
		{"negative cpu", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{CpuMillis: -5}}, "cpu -5"},
		{"too many cpus", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{CpuMillis: 64000}}, "cpu 64 CPUs"},
		{"pids too few", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{Pids: 2}}, "pids 2"},
		{"disk too small", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{DiskBytes: 10}}, "disk 10B"},
		{"timeout too long", &sbxv1.CreateSandboxRequest{TimeoutMs: 1 << 40}, "timeout"},
		{"negative idle", &sbxv1.CreateSandboxRequest{IdleTimeoutMs: -1}, "idle timeout"},
		{"domain secret", dsReq(&sbxv1.DomainSecret{Name: "API_KEY", Value: "v", Domains: []string{"api.example.com", "*.example.org"}}), ""},
		{"domain secret without name", dsReq(&sbxv1.DomainSecret{Value: "v", Domains: []string{"a.test"}}), "domain_secrets[0]: no name"},
		{"domain secret with a bad name", dsReq(&sbxv1.DomainSecret{Name: "A-B", Value: "v", Domains: []string{"a.test"}}), `domain secret name "A-B"`},
		{"domain secret without domains", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v"}), `domain secret "K": no domains`},
		{"domain secret with a bad domain", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"*.com"}}), `domain "*.com"`},
		{"domain secret without value", dsReq(&sbxv1.DomainSecret{Name: "K", Domains: []string{"a.test"}}), "empty value"},
		{"domain secret with headers and the query", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, Headers: []string{"X-Api-Key", "authorization"}, AllowQuery: true}), ""},
		{"domain secret with a bad header name", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, Headers: []string{"X Api"}}), `header "X Api" is not a valid HTTP header name`},
		{"domain secret in a hop-by-hop header", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, Headers: []string{"connection"}}), `header "connection" cannot carry a secret`},
		{"domain secret in Host", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, Headers: []string{"Host"}}), `header "Host" cannot carry a secret`},
		{"domain secret with too many headers", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, Headers: make([]string, 17)}), "17 headers given, at most 16"},
		{"domain secret with a line break", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "a\nb", Domains: []string{"a.test"}}), "line break"},
		{"domain secret twice", dsReq(&sbxv1.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}}, &sbxv1.DomainSecret{Name: "K", Value: "w", Domains: []string{"b.test"}}), "given twice"},
		{"domain secret clashing with env", &sbxv1.CreateSandboxRequest{Env: map[string]string{"K": "1"}, DomainSecrets: []*sbxv1.DomainSecret{{Name: "K", Value: "v", Domains: []string{"a.test"}}}}, "both as env and as a domain secret"},
		{"domain secret clashing with a secret", &sbxv1.CreateSandboxRequest{Secrets: map[string]string{"K": "1"}, DomainSecrets: []*sbxv1.DomainSecret{{Name: "K", Value: "v", Domains: []string{"a.test"}}}}, "both as a secret and as a domain secret"},
		{"domain secret named like the CA bundle", dsReq(&sbxv1.DomainSecret{Name: "SSL_CERT_FILE", Value: "v", Domains: []string{"a.test"}}), "reserved"},
		{"too many labels", &sbxv1.CreateSandboxRequest{Labels: manyStrings(100_000)}, "labels: 100000 given, at most 256"},
		{"too many env vars", &sbxv1.CreateSandboxRequest{Env: manyStrings(100_000)}, "command: 100000 environment variables, at most 4096"},
		{"env and secrets counted together", &sbxv1.CreateSandboxRequest{Env: manyStrings(3000), Secrets: manyStrings(1500)}, "4500 environment variables"},
		{"too many arguments", &sbxv1.CreateSandboxRequest{Command: make([]string, 100_000)}, "command: 100000 arguments, at most 4096"},
		{"huge argument", &sbxv1.CreateSandboxRequest{Command: []string{"sh", strings.Repeat("x", 200<<10)}}, "command argument 1: 204800 bytes"},
		{"huge command in total", &sbxv1.CreateSandboxRequest{Command: slicesRepeat(strings.Repeat("x", 100<<10), 12)}, "arguments and environment are"},
		{"huge workdir", &sbxv1.CreateSandboxRequest{Workdir: "/" + strings.Repeat("w", 10_000)}, "workdir: 10001 bytes, at most 4095"},
		{"too many volumes", &sbxv1.CreateSandboxRequest{Volumes: make([]*sbxv1.VolumeMount, 65)}, "volumes: 65 given, at most 64"},
		{"too many allow cidrs", &sbxv1.CreateSandboxRequest{Network: &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_ALLOW, AllowCidrs: make([]string, 100_000)}}, "allow_cidrs: 100000 entries, at most 1024"},
		{"pids above the host", &sbxv1.CreateSandboxRequest{Resources: &sbxv1.Resources{Pids: 40000}}, "pids 40000: above this host's maximum"},
		{"all good", &sbxv1.CreateSandboxRequest{Name: "ok", Resources: &sbxv1.Resources{MemoryBytes: 64 << 20, CpuMillis: 500, Pids: 64, DiskBytes: 64 << 20}, TimeoutMs: 60000}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validateCreate(tt.req, testLimits)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want it to wrap ErrInvalidArgument", err)
			}
		})
	}
}

func TestSelectors(t *testing.T) {
	labels := map[string]string{"team": "a", "env": "prod"}
	tests := []struct {
		terms []string
		want  bool
	}{
		{nil, true},
		{[]string{"team=a"}, true},
		{[]string{"team=b"}, false},
		{[]string{"team!=b"}, true},
		{[]string{"team!=a"}, false},
		{[]string{"env"}, true},
		{[]string{"!env"}, false},
		{[]string{"!owner"}, true},
		{[]string{"team=a", "env=prod"}, true},
		{[]string{"team=a", "env=dev"}, false},
	}
	for _, tt := range tests {
		sel, err := ParseSelectors(tt.terms)
		if err != nil {
			t.Fatalf("%v: %v", tt.terms, err)
		}
		if got := Matches(sel, labels); got != tt.want {
			t.Errorf("Matches(%v) = %v, want %v", tt.terms, got, tt.want)
		}
	}
	if _, err := ParseSelectors([]string{"bad key=x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad selector: got %v, want ErrInvalidArgument", err)
	}
}

func TestNewIDShape(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newID()
		if !IsID(id) {
			t.Fatalf("newID() = %q, not an id", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}

func dsReq(ds ...*sbxv1.DomainSecret) *sbxv1.CreateSandboxRequest {
	return &sbxv1.CreateSandboxRequest{DomainSecrets: ds}
}
