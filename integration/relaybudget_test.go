package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// countingWriter counts what it is given and keeps none of it.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// ticksPerSecond is USER_HZ, the unit of /proc/PID/stat's CPU times.
const ticksPerSecond = 100

// TestOutputFloodDaemonCPU: a box writing output as fast as it can has
// every byte relayed to an SDK client through the undecoded path, and the
// test logs the daemon's CPU per GiB relayed. The figure is not asserted:
// CPU time on a loaded CI machine swung from 0.5 to 1.6 s per GiB for the
// same code; `sbx-bench -only ab` compares it with the old relay in one run
// (0.28-0.52x of it; decoding and re-encoding each frame cost about 1.9 s).
func TestOutputFloodDaemonCPU(t *testing.T) {
	const flood = 512 << 20
	d := startDaemon(t)
	ctx := context.Background()
	attacker := newBox(t, ctx, d, sbx.CreateOptions{Name: "flood", Timeout: 10 * time.Minute})
	pid := d.cmd.Process.Pid
	// Warm up the box's connections, so the measurement is the flood's.
	if res, err := attacker.Run(ctx, "true"); err != nil || res.Code != 0 {
		t.Fatalf("warm-up exec: %v, %v", res, err)
	}
	var got countingWriter
	t0 := cpuTicks(t, pid)
	st, err := attacker.Exec(ctx, sbx.ExecOptions{Shell: fmt.Sprintf("head -c %d /dev/zero", flood), Stdout: &got})
	if err != nil || st.Code != 0 {
		t.Fatalf("flood: %v, %v", st, err)
	}
	ticks := cpuTicks(t, pid) - t0
	if got.n != flood {
		t.Fatalf("relayed %d bytes, want %d", got.n, flood)
	}
	perGiB := float64(ticks) / ticksPerSecond / (float64(got.n) / (1 << 30))
	t.Logf("daemon CPU %.2f s per GiB relayed (%d ticks for %d MiB)", perGiB, ticks, got.n>>20)
}

// TestOutputRelayBudget: with --exec-relay-rate, the output relayed for one
// sandbox (all its commands together) stays within that many bytes per
// second, whatever its box could write: two commands flooding at once
// take at least as long as their bytes and frames cost from one budget,
// and their output still arrives whole.
func TestOutputRelayBudget(t *testing.T) {
	const (
		rate  = 16 << 20 // bytes per second
		flood = 24 << 20 // per command
		burst = 1 << 20  // server.relayBurst
	)
	d := startDaemon(t, "--exec-relay-rate", fmt.Sprint(rate))
	ctx := context.Background()
	sb := newBox(t, ctx, d, sbx.CreateOptions{Name: "budget", CPUs: 2, Timeout: 10 * time.Minute})
	start := time.Now()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			var got countingWriter
			st, err := sb.Exec(ctx, sbx.ExecOptions{Shell: fmt.Sprintf("head -c %d /dev/zero", flood), Stdout: &got})
			switch {
			case err != nil:
			case st.Code != 0:
				err = fmt.Errorf("exited %d", st.Code)
			case got.n != flood:
				err = fmt.Errorf("relayed %d bytes, want %d", got.n, flood)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	// The bytes alone, less the bucket's burst, at the rate: a lower
	// bound (frames cost more on top).
	least := time.Duration(float64(2*flood-burst) / rate * float64(time.Second))
	t.Logf("%d MiB from two commands in %v (budget %d MiB/s: at least %v)", 2*flood>>20, took, rate>>20, least)
	if took < least {
		t.Errorf("two floods of %d MiB relayed in %v, want at least %v at %d MiB/s for the sandbox", flood>>20, took, least, rate>>20)
	}
}

// TestCodeRelayBudget: a code run's and a session command's output
// (internal/codeexec relays them, not the exec path) costs the same
// per-sandbox budget as exec output. A python run, a session command and an
// exec flooding at once take at least as long as their bytes cost from one
// budget (with only the exec charged, the three finished in about the time
// of the exec alone), and every byte still arrives.
func TestCodeRelayBudget(t *testing.T) {
	const (
		// A rate well under what the code and session paths relay
		// unbudgeted, so that their sharing it shows.
		rate  = 2 << 20 // bytes per second
		flood = 6 << 20 // per command
		burst = 1 << 20 // server.relayBurst
	)
	d := startDaemon(t, "--exec-relay-rate", fmt.Sprint(rate))
	ctx := context.Background()
	sb := newBox(t, ctx, d, sbx.CreateOptions{Name: "codebudget", CPUs: 2, MemoryBytes: 512 << 20, Timeout: 10 * time.Minute})
	ss, err := sb.CreateSession(ctx, sbx.SessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Warm up: the interpreter's first start is not part of the flood.
	if res, err := sb.RunCode(ctx, "python", "print(1)", sbx.RunCodeOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("warm-up run: %+v, %v", res, err)
	}
	floods := map[string]func(w *countingWriter) error{
		"exec": func(w *countingWriter) error {
			st, err := sb.Exec(ctx, sbx.ExecOptions{Shell: fmt.Sprintf("head -c %d /dev/zero", flood), Stdout: w})
			if err == nil && st.Code != 0 {
				err = fmt.Errorf("exited %d", st.Code)
			}
			return err
		},
		"code run": func(w *countingWriter) error {
			code := fmt.Sprintf("import os\nb = b'x' * 65536\nfor _ in range(%d):\n    os.write(1, b)\n", flood/65536)
			res, err := sb.RunCode(ctx, "python", code, sbx.RunCodeOptions{Stdout: w})
			if err == nil && (res.ExitCode != 0 || res.Error != "") {
				err = fmt.Errorf("exited %d: %s %s", res.ExitCode, res.Error, res.Stderr)
			}
			return err
		},
		"session command": func(w *countingWriter) error {
			res, err := ss.Exec(ctx, fmt.Sprintf("yes | head -c %d", flood), sbx.SessionExecOptions{Stdout: w})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exited %d", res.ExitCode)
			}
			return err
		},
	}
	start := time.Now()
	errs := make(chan error, len(floods))
	for name, run := range floods {
		go func() {
			var got countingWriter
			err := run(&got)
			if err == nil && got.n != flood {
				err = fmt.Errorf("relayed %d bytes, want %d", got.n, flood)
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
			errs <- err
		}()
	}
	for range floods {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	least := time.Duration(float64(len(floods)*flood-burst) / rate * float64(time.Second))
	t.Logf("%d MiB from an exec, a code run and a session command in %v (budget %d MiB/s: at least %v)",
		len(floods)*flood>>20, took, rate>>20, least)
	if took < least {
		t.Errorf("three floods of %d MiB relayed in %v, want at least %v at %d MiB/s for the sandbox", flood>>20, took, least, rate>>20)
	}
}
