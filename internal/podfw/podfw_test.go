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
		{args: []string{"nftables", "none", "7700", "7701"}, want: Rules{Backend: BackendNFTables, Mode: ModeNone, AgentPorts: []uint16{7700, 7701}}},
		{args: []string{"iptables", "none", "7700"}, want: Rules{Backend: BackendIPTables, Mode: ModeNone, AgentPorts: []uint16{7700}}},
		{args: []string{"nftables", "none"}, want: Rules{Backend: BackendNFTables, Mode: ModeNone}},
		{args: nil, wantErr: "usage"},
		{args: []string{"nftables"}, wantErr: "usage"},
		{args: []string{"none", "7700"}, wantErr: `backend "none"`},
		{args: []string{"ebpf", "none"}, wantErr: `backend "ebpf"`},
		{args: []string{"nftables", "public"}, wantErr: `mode "public"`},
		{args: []string{"iptables", "none", "0"}, wantErr: `agent port "0"`},
		{args: []string{"nftables", "none", "65536"}, wantErr: `agent port "65536"`},
		{args: []string{"nftables", "none", "x"}, wantErr: `agent port "x"`},
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
