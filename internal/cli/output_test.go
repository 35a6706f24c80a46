package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestProtoJSON(t *testing.T) {
	sb := &sbxv1.Sandbox{
		Id: "sb-1", State: sbxv1.SandboxState_SANDBOX_STATE_RUNNING, Labels: map[string]string{"a": "b"},
		CreatedAtMs: 1_700_000_000_123, Resources: &sbxv1.Resources{MemoryBytes: 1 << 40},
		Network: &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_NONE},
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, protoJSON(sb)); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	dec := json.NewDecoder(&buf)
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path []string
		want any
	}{
		{[]string{"id"}, "sb-1"},
		{[]string{"state"}, "running"},                          // short enum
		{[]string{"idleAction"}, "unspecified"},                 // unset enums too
		{[]string{"createdAtMs"}, json.Number("1700000000123")}, // int64 as a number
		{[]string{"resources", "memoryBytes"}, json.Number("1099511627776")},
		{[]string{"network", "mode"}, "none"},
		{[]string{"labels", "a"}, "b"},
		{[]string{"stats"}, nil}, // unset message: null, the key is there
		{[]string{"secretNames"}, []any{}},
	} {
		var v any = got
		for _, k := range c.path {
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%v: %v is not an object", c.path, v)
			}
			if v, ok = m[k]; !ok {
				t.Fatalf("%v: no key %q in %v", c.path, k, m)
			}
		}
		if diff := cmp.Diff(c.want, v); diff != "" {
			t.Errorf("%s: got %#v, want %#v", strings.Join(c.path, "."), v, c.want)
		}
	}
}

func TestEnumText(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{protoEnumText(sbxv1.SandboxState_SANDBOX_STATE_STOPPED), "stopped"},
		{protoEnumText(sbxv1.FileType_FILE_TYPE_DIR), "dir"},
		{protoEnumText(sbxv1.PatternType_PATTERN_TYPE_DIRECTORY), "directory"},
		{protoEnumText(sbxv1.Severity_SEVERITY_HIGH), "high"},
		{protoEnumText(sbxv1.SandboxState(99)), "99"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// TestListCommandsHaveOutputFlags walks the command tree: every ls has
// --json and -q.
func TestListCommandsHaveOutputFlags(t *testing.T) {
	root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	seen := 0
	walk = func(c *cobra.Command) {
		if c.Name() == "ls" || c.Name() == "port" {
			seen++
			if c.Flags().Lookup("json") == nil {
				t.Errorf("%s: no --json", c.CommandPath())
			}
			if f := c.Flags().ShorthandLookup("q"); f == nil || f.Name != "quiet" {
				t.Errorf("%s: no -q/--quiet", c.CommandPath())
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if seen < 8 {
		t.Errorf("found %d listing commands, want at least 8 (ls, images, volume, codebase, session, context, tenant ls; port)", seen)
	}
}
