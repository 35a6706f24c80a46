package cli

import "testing"

func TestParseForward(t *testing.T) {
	for _, tc := range []struct {
		spec       string
		wantLocal  string
		wantRemote uint32
		wantErr    bool
	}{
		{"8080:80", "127.0.0.1:8080", 80, false},
		{"0:5432", "127.0.0.1:0", 5432, false},
		{"0.0.0.0:8080:80", "0.0.0.0:8080", 80, false},
		{"[::1]:8080:80", "[::1]:8080", 80, false},
		{"localhost:1:2", "localhost:1", 2, false},
		{"80", "", 0, true},
		{"8080:0", "", 0, true},
		{"8080:70000", "", 0, true},
		{"x:80", "", 0, true},
	} {
		local, remote, err := parseForward(tc.spec)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: got error %v, want error %v", tc.spec, err, tc.wantErr)
			continue
		}
		if local != tc.wantLocal || remote != tc.wantRemote {
			t.Errorf("%q: got %q %d, want %q %d", tc.spec, local, remote, tc.wantLocal, tc.wantRemote)
		}
	}
}
