package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCommandArgsNeedNoDashes parses command lines the way cobra does:
// sbx's flags end at the sandbox (or, for run, at the command); whatever
// follows, flags included, is the command's.
func TestCommandArgsNeedNoDashes(t *testing.T) {
	for _, c := range []struct {
		line     string
		wantArgs []string // after dropDashes of the command part
		flag     string
		flagVal  string
	}{
		{"exec box python3 -c print(1)", []string{"box", "python3", "-c", "print(1)"}, "", ""},
		{"exec box -- python3 -c print(1)", []string{"box", "python3", "-c", "print(1)"}, "", ""},
		{"exec -e A=1 -w /tmp box ls -la", []string{"box", "ls", "-la"}, "workdir", "/tmp"},
		{"exec -u 1000 box -- -- x", []string{"box", "--", "x"}, "user", "1000"},
		{"exec box sh -c 'exit 3' -u x", []string{"box", "sh", "-c", "'exit", "3'", "-u", "x"}, "user", ""},
		{"run --image alpine python3 -V", []string{"python3", "-V"}, "image", "alpine"},
		{"run --image alpine -- python3 -V", []string{"python3", "-V"}, "image", "alpine"},
		{"session exec --timeout 5s s1 ls -la", []string{"s1", "ls", "-la"}, "timeout", "5s"},
	} {
		t.Run(c.line, func(t *testing.T) {
			root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
			cmd, rest, err := root.Find(strings.Fields(c.line))
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Fatalf("parsing %q: %v", c.line, err)
			}
			args := cmd.Flags().Args()
			if err := cmd.ValidateArgs(args); err != nil {
				t.Fatalf("args of %q: %v", c.line, err)
			}
			lead := 1
			if cmd.Name() == "run" {
				lead = 0
			}
			got := append(append([]string{}, args[:lead]...), dropDashes(args[lead:])...)
			if diff := cmp.Diff(c.wantArgs, got); diff != "" {
				t.Errorf("args of %q (-want +got):\n%s", c.line, diff)
			}
			if c.flag != "" {
				if v := cmd.Flags().Lookup(c.flag).Value.String(); v != c.flagVal {
					t.Errorf("--%s of %q: got %q, want %q", c.flag, c.line, v, c.flagVal)
				}
			}
		})
	}
	for _, line := range []string{"exec box", "exec box --", "exec", "run", "run --"} {
		root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
		cmd, rest, _ := root.Find(strings.Fields(line))
		_ = cmd.ParseFlags(rest)
		if err := cmd.ValidateArgs(cmd.Flags().Args()); err == nil {
			t.Errorf("%q: accepted without a command", line)
		}
	}
}
