// Package cli owns the `sbx` command line: `sbx serve` starts the daemon
// (internal/daemon); every other subcommand is a client of it through the Go
// SDK, shaped like docker's CLI. cmd/sbx only calls Main.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// ExitError carries a process exit code out of a command.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return "exit status " + strconv.Itoa(e.Code) }

// Main runs the CLI with args (without the program name) and returns the
// process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdin, stdout, stderr)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	fmt.Fprintln(stderr, "sbx:", err)
	return 125
}

type app struct {
	addr   string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

func (a *app) client() *sbx.Client { return sbx.NewClient(a.addr) }

func newRoot(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "sbx",
		Short:         "Isolated, ephemeral sandboxes for running untrusted code",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&a.addr, "addr", "", "daemon address host:port (default $SBX_ADDR or "+sbx.DefaultAddr+")")
	root.AddCommand(
		newServe(a), newCreate(a), newExec(a), newRun(a), newLs(a), newInspect(a),
		newRm(a), newStop(a), newStart(a), newCp(a), newVersion(a), newPull(a), newImages(a),
		newSnapshot(a), newBuild(a), newNetwork(a),
		newRunCode(a), newContext(a), newSession(a), newVolume(a), newCodebase(a),
		newPort(a), newPortForward(a), newTenant(a), newLogs(a), newWait(a), newUpdate(a), newMCP(a), newEvents(a), newStats(a),
		newPs(a), newAttach(a), newKill(a), newProc(a),
	)
	return root
}

// parseSize parses docker-style sizes: 512M, 1G, 1.5g, 64Mi, 1024 (bytes).
func parseSize(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "b"), "i")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad size %q: want e.g. 512M or 1G", s)
	}
	return int64(f * float64(mult)), nil
}

// parseKV parses repeated K=V flags.
func parseKV(what string, items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad %s %q: want KEY=VALUE", what, it)
		}
		m[k] = v
	}
	return m, nil
}

// parseEnv is parseKV that also accepts a bare KEY, taking its value from
// this process's environment (like docker -e KEY).
func parseEnv(items []string) (map[string]string, error) {
	var kv []string
	for _, it := range items {
		if !strings.Contains(it, "=") {
			v, ok := os.LookupEnv(it)
			if !ok {
				return nil, fmt.Errorf("env %q: not set here; give KEY=VALUE", it)
			}
			it = it + "=" + v
		}
		kv = append(kv, it)
	}
	return parseKV("env", kv)
}
