package podfw

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    Rules
		wantErr string
	}{
		{args: []string{"none", "7700", "7701"}, want: Rules{Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}},
		{args: []string{"none"}, want: Rules{Mode: ModeNone}},
		{args: nil, wantErr: "usage"},
		{args: []string{"public"}, wantErr: `mode "public"`},
		{args: []string{"none", "0"}, wantErr: `agent port "0"`},
		{args: []string{"none", "65536"}, wantErr: `agent port "65536"`},
		{args: []string{"none", "x"}, wantErr: `agent port "x"`},
	} {
		got, err := Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse(%q): got %v, want an error with %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.args, got, err, tc.want)
		}
	}
}
