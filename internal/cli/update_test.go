package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func TestUpdateFlags(t *testing.T) {
	two, zero := 2*time.Minute, time.Duration(0)
	yes, no := true, false
	for _, tc := range []struct {
		args    []string
		want    sbx.UpdateOptions
		wantErr string
	}{
		{args: []string{"--timeout", "2m"}, want: sbx.UpdateOptions{Timeout: &two}},
		{args: []string{"--timeout", "0"}, want: sbx.UpdateOptions{Timeout: &zero}},
		{args: []string{"--label", "k=v", "--label-rm", "old"}, want: sbx.UpdateOptions{SetLabels: map[string]string{"k": "v"}, RemoveLabels: []string{"old"}}},
		{args: []string{"--memory", "1G", "--cpus", "1.5", "--pids", "256"}, want: sbx.UpdateOptions{MemoryBytes: 1 << 30, CPUs: 1.5, Pids: 256}},
		{args: []string{"--auto-resume"}, want: sbx.UpdateOptions{AutoResume: &yes}},
		{args: []string{"--auto-resume=false"}, want: sbx.UpdateOptions{AutoResume: &no}},
		{args: []string{"--idle-timeout", "0", "--idle-action", "stop"}, want: sbx.UpdateOptions{IdleTimeout: &zero, StopWhenIdle: &yes}},
		{args: nil, wantErr: "nothing to update"},
		{args: []string{"--timeout", "-1s"}, wantErr: "--timeout -1s: must not be negative"},
		{args: []string{"--memory", "0"}, wantErr: `--memory "0": must be positive`},
		{args: []string{"--memory", "lots"}, wantErr: `bad size "lots"`},
		{args: []string{"--cpus", "0"}, wantErr: "--cpus 0: must be positive"},
		{args: []string{"--pids", "-3"}, wantErr: "--pids -3: must be positive"},
		{args: []string{"--idle-action", "sleep"}, wantErr: `--idle-action "sleep": want stop or destroy`},
		{args: []string{"--label", "novalue"}, wantErr: `bad label "novalue"`},
	} {
		cmd := &cobra.Command{}
		var uf updateFlags
		uf.add(cmd)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		got, err := uf.options(cmd)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: got error %v, want one containing %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%v: options (-want +got):\n%s", tc.args, diff)
		}
	}
}
