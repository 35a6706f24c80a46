package cli

import (
	"strings"
	"testing"
)

func TestParseSignal(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int
		wantErr string
	}{
		{"9", 9, ""},
		{"KILL", 9, ""},
		{"term", 15, ""},
		{"SIGINT", 2, ""},
		{"0", 0, "want 1 to 64"},
		{"65", 0, "want 1 to 64"},
		{"NOPE", 0, "unknown signal"},
	} {
		got, err := parseSignal(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("parseSignal(%q): %v, want an error containing %q", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("parseSignal(%q): got %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
