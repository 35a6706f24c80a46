package server

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvdToken: a sandbox's envd token names its sandbox and verifies only
// under the key that made it, unaltered; the key is made once, kept 0600 in
// the data directory and read back unchanged (tokens survive a restart).
func TestEnvdToken(t *testing.T) {
	dir := t.TempDir()
	key, err := LoadEnvdKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadEnvdKey(dir)
	if err != nil || !bytes.Equal(key, again) {
		t.Fatalf("the key read back: got %x (%v), want %x", again, err, key)
	}
	if st, err := os.Stat(filepath.Join(dir, EnvdKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: got %v (%v), want mode 0600", st, err)
	}
	other := bytes.Repeat([]byte{7}, envdKeyLen)
	tokA, tokB := EnvdToken(key, "sb-aaaa"), EnvdToken(key, "sb-bbbb")
	macB := tokB[strings.LastIndexByte(tokB, '.'):]
	for _, tc := range []struct {
		name, tok string
		key       []byte
		want      string // "" = refused
	}{
		{"its own", tokA, key, "sb-aaaa"},
		{"another key", tokA, other, ""},
		{"another sandbox's MAC", "sbx_envd.sb-aaaa" + macB, key, ""},
		{"renamed", strings.Replace(tokA, "sb-aaaa", "sb-aaab", 1), key, ""},
		{"truncated", tokA[:len(tokA)-2], key, ""},
		{"no prefix", strings.TrimPrefix(tokA, envdTokenPrefix), key, ""},
		{"an API key", "0123456789abcdef0123456789abcdef", key, ""},
		{"no key", tokA, nil, ""},
	} {
		got, ok := envdSandbox(tc.key, tc.tok)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: got %q %v, want %q", tc.name, got, ok, tc.want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, EnvdKeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadEnvdKey(dir); err == nil || !strings.Contains(err.Error(), "5 bytes") {
		t.Errorf("a 5-byte key file: got %v, want an error naming its length", err)
	}
}
