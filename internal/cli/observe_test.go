package cli

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestParseEventFilters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		terms   []string
		want    *sbxv1.EventsRequest
		wantErr string
	}{
		{"none", nil, &sbxv1.EventsRequest{}, ""},
		{"comma-separated and repeated", []string{"type=oom,type=exec-ended", "sandbox=web,label=team=ml"}, &sbxv1.EventsRequest{
			Types:     []sbxv1.EventType{sbxv1.EventType_EVENT_TYPE_OOM, sbxv1.EventType_EVENT_TYPE_EXEC_ENDED},
			Sandboxes: []string{"web"}, LabelSelectors: []string{"team=ml"},
		}, ""},
		{"unknown type", []string{"type=exploded"}, nil, `event type "exploded": unknown (have created, started`},
		{"the unspecified type", []string{"type=unspecified"}, nil, `event type "unspecified": unknown`},
		{"unknown key", []string{"colour=red"}, nil, `unknown key "colour"`},
		{"no value", []string{"sandbox="}, nil, `want type=TYPE`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := &sbxv1.EventsRequest{}
			err := parseEventFilters(tc.terms, got)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, protocmp.Transform()); d != "" {
				t.Errorf("request (-want +got):\n%s", d)
			}
		})
	}
}

func TestEventLine(t *testing.T) {
	ev := &sbxv1.Event{TimeMs: 0, Type: sbxv1.EventType_EVENT_TYPE_EXEC_ENDED, SandboxId: "sb-1", SandboxName: "web",
		Reason: "oom", ExitCode: 137, Signal: 9, Detail: "sh"}
	got := eventLine(ev)
	if want := " exec_ended sb-1 (web) reason=oom exit_code=137 signal=9: sh"; !strings.HasSuffix(got, want) {
		t.Errorf("got %q, want it to end in %q", got, want)
	}
}
