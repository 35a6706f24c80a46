package server

import (
	"strings"
	"testing"
)

func TestValidProcessID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"proc-0123456789abcdef", true},
		{"proc-0123456789ABCDEF", false},
		{"proc-0123456789abcde", false},
		{"proc-0123456789abcdefa", false},
		{"sess-0123456789abcdef", false},
		{"proc-0123456789abcdeg", false},
		{"", false},
	} {
		if got := validProcessID(tc.id); got != tc.want {
			t.Errorf("validProcessID(%q): got %v, want %v", tc.id, got, tc.want)
		}
	}
	if id := newProcessID(); !validProcessID(id) {
		t.Errorf("newProcessID gave %q, which validProcessID refuses", id)
	}
}

func TestCheckTag(t *testing.T) {
	for _, tc := range []struct {
		tag, wantErr string
	}{
		{"", ""},
		{"web-server", ""},
		{"v1.2", ""},
		{"123", "all digits"},
		{"proc-x", "starts with"},
		{strings.Repeat("x", 257), "more than 256"},
		{"a\x00b", "NUL"},
		{"\xff", "UTF-8"},
	} {
		err := checkTag(tc.tag)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("checkTag(%q): %v, want nil", tc.tag, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("checkTag(%q): %v, want an error containing %q", tc.tag, err, tc.wantErr)
		}
	}
}
