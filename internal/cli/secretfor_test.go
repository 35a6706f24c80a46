package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func TestParseSecretFor(t *testing.T) {
	env := func(k string) (string, bool) {
		if k == "FROM_ENV" {
			return "env-value", true
		}
		return "", false
	}
	tests := []struct {
		in      string
		want    sbx.DomainSecret
		wantErr string
	}{
		{in: "K=v@api.test", want: sbx.DomainSecret{Name: "K", Value: "v", Domains: []string{"api.test"}}},
		{in: "K=p@ss=w@rd@a.test,*.b.test", want: sbx.DomainSecret{Name: "K", Value: "p@ss=w@rd", Domains: []string{"a.test", "*.b.test"}}},
		{in: "FROM_ENV@a.test", want: sbx.DomainSecret{Name: "FROM_ENV", Value: "env-value", Domains: []string{"a.test"}}},
		{in: "UNSET@a.test", wantErr: "$UNSET is not set"},
		{in: "K=topsecret", wantErr: "K=…"},
		{in: "K=v@", wantErr: "no hosts"},
		{in: "=v@a.test", wantErr: "no name"},
		{in: "K=v@a.test;header=X-Api-Key", want: sbx.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, Headers: []string{"X-Api-Key"}}},
		{in: "K=v;x@a.test,b.test;header=X-A, X-B;header=Authorization;query", want: sbx.DomainSecret{Name: "K", Value: "v;x",
			Domains: []string{"a.test", "b.test"}, Headers: []string{"X-A", "X-B", "Authorization"}, AllowQuery: true}},
		{in: "K=v@a.test;query", want: sbx.DomainSecret{Name: "K", Value: "v", Domains: []string{"a.test"}, AllowQuery: true}},
		{in: "K=topsecret@a.test;header=", wantErr: "names no header"},
		{in: "K=topsecret@a.test;query=yes", wantErr: "takes no value"},
		{in: "K=topsecret@a.test;headers=X", wantErr: `unknown option "headers"`},
		{in: "K=topsecret@;query", wantErr: "no hosts"},
	}
	for _, tt := range tests {
		got, err := parseSecretForEnv([]string{tt.in}, env)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "topsecret") {
				t.Errorf("parseSecretFor(%q): got error %v, want one with %q and no value", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseSecretFor(%q): %v", tt.in, err)
			continue
		}
		if d := cmp.Diff([]sbx.DomainSecret{tt.want}, got); d != "" {
			t.Errorf("parseSecretFor(%q) (-want +got):\n%s", tt.in, d)
		}
	}
}
