package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// JSON clients name enum values as the CLI, the SDKs and the docs do
// ("critical"); Connect's own codec dropped such a value, so a rule sent
// with severity "critical" scored medium.
func TestJSONEnumNames(t *testing.T) {
	for _, tc := range []struct {
		name, json    string
		threshold     sbxv1.Severity
		rule          sbxv1.Severity
		mode          sbxv1.PolicyMode
		wantErrSubstr string
	}{
		{name: "short names", json: `{"policy":{"mode":"enforce","threshold":"critical","rules":[{"id":"r","pattern":"x","severity":"critical"}]}}`,
			threshold: sbxv1.Severity_SEVERITY_CRITICAL, rule: sbxv1.Severity_SEVERITY_CRITICAL, mode: sbxv1.PolicyMode_POLICY_MODE_ENFORCE},
		{name: "short names in any case", json: `{"policy":{"threshold":"High","rules":[{"id":"r","pattern":"x","severity":"LOW"}]}}`,
			threshold: sbxv1.Severity_SEVERITY_HIGH, rule: sbxv1.Severity_SEVERITY_LOW},
		{name: "proto names", json: `{"policy":{"threshold":"SEVERITY_HIGH","rules":[{"id":"r","pattern":"x","severity":"SEVERITY_MEDIUM"}]}}`,
			threshold: sbxv1.Severity_SEVERITY_HIGH, rule: sbxv1.Severity_SEVERITY_MEDIUM},
		{name: "numbers", json: `{"policy":{"threshold":4,"rules":[{"id":"r","pattern":"x","severity":1}]}}`,
			threshold: sbxv1.Severity_SEVERITY_CRITICAL, rule: sbxv1.Severity_SEVERITY_LOW},
		{name: "unknown fields still dropped", json: `{"future":1,"policy":{"threshold":"critical","rules":[{"id":"r","pattern":"x","severity":"low","later":true}]}}`,
			threshold: sbxv1.Severity_SEVERITY_CRITICAL, rule: sbxv1.Severity_SEVERITY_LOW},
		{name: "unknown name refused", json: `{"policy":{"rules":[{"id":"r","pattern":"x","severity":"severe"}]}}`,
			wantErrSubstr: `policy.rules.severity: unknown Severity value "severe" (one of low, medium, high, critical)`},
		{name: "empty name refused", json: `{"policy":{"threshold":""}}`,
			wantErrSubstr: `policy.threshold: unknown Severity value ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var req sbxv1.RunCodeRequest
			err := (&enumJSONCodec{name: "json"}).Unmarshal([]byte(tc.json), &req)
			if tc.wantErrSubstr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSubstr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErrSubstr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p := req.GetPolicy()
			if got := p.GetThreshold(); got != tc.threshold {
				t.Errorf("threshold: got %v, want %v", got, tc.threshold)
			}
			if got := p.GetRules()[0].GetSeverity(); got != tc.rule {
				t.Errorf("rule severity: got %v, want %v", got, tc.rule)
			}
			if got := p.GetMode(); got != tc.mode {
				t.Errorf("mode: got %v, want %v", got, tc.mode)
			}
		})
	}
}

// recordingCode answers RunCode after recording its request.
type recordingCode struct {
	sbxv1connect.UnimplementedCodeServiceHandler
	got chan *sbxv1.RunCodeRequest
}

func (r *recordingCode) RunCode(_ context.Context, req *connect.Request[sbxv1.RunCodeRequest], _ *connect.ServerStream[sbxv1.RunCodeEvent]) error {
	r.got <- req.Msg
	return nil
}

// The API's handlers use the codec: a Connect JSON stream with "critical"
// reaches the service as SEVERITY_CRITICAL, and a misspelt name is refused
// with InvalidArgument before the service sees it.
func TestJSONEnumNamesOverHTTP(t *testing.T) {
	rec := &recordingCode{got: make(chan *sbxv1.RunCodeRequest, 1)}
	mux := http.NewServeMux()
	serveService(mux, func(o ...connect.HandlerOption) (string, http.Handler) {
		return sbxv1connect.NewCodeServiceHandler(rec, o...)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(body string) (int, string) {
		var env bytes.Buffer
		env.WriteByte(0)
		_ = binary.Write(&env, binary.BigEndian, uint32(len(body)))
		env.WriteString(body)
		resp, err := http.Post(srv.URL+sbxv1connect.CodeServiceRunCodeProcedure, "application/connect+json", &env)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(`{"language":"python","code":"1","policy":{"rules":[{"id":"r","pattern":"x","severity":"critical"}]}}`); code != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", code, body)
	}
	if got := (<-rec.got).GetPolicy().GetRules()[0].GetSeverity(); got != sbxv1.Severity_SEVERITY_CRITICAL {
		t.Fatalf("severity \"critical\" reached the service as %v, want SEVERITY_CRITICAL", got)
	}
	_, body := post(`{"language":"python","code":"1","policy":{"rules":[{"id":"r","pattern":"x","severity":"crit"}]}}`)
	if !strings.Contains(body, "invalid_argument") || !strings.Contains(body, `unknown Severity value \"crit\"`) {
		t.Fatalf("a misspelt severity: got %s, want invalid_argument naming the value", body)
	}
	select {
	case r := <-rec.got:
		t.Fatalf("the service saw a request with a misspelt severity: %v", r)
	default:
	}
}
