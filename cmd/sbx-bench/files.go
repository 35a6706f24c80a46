package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// filesBytes is the size of the file the data path is measured with (the
// scale issue's 100 MiB).
const filesBytes = 100 << 20

// throughput is one data path measured several times.
type throughput struct {
	name string
	mibs []float64 // MiB/s of each sample
}

func (t throughput) p50() float64 {
	if len(t.mibs) == 0 {
		return 0
	}
	s := append([]float64(nil), t.mibs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// rate times f and records its MiB/s for size bytes.
func (t *throughput) rate(size int64, f func() error) error {
	t0 := time.Now()
	if err := f(); err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	t.mibs = append(t.mibs, float64(size)/(1<<20)/time.Since(t0).Seconds())
	return nil
}

// pythonBench is the script that measures the Python SDK's data path, and
// the interpreter it runs with (Debian's: the SDK needs nothing else).
const (
	pythonBench = "scripts/bench-python-files.py"
	pythonBin   = "/usr/bin/python3"
)

// runFiles measures moving a 100 MiB file of random bytes into and out of a
// sandbox through the Go SDK, the Python SDK (scripts/bench-python-files.py,
// when run from the repository with /usr/bin/python3 present) and `sbx cp`,
// beside two floors measured in the same run: the same bytes over a plain
// loopback TCP connection, and `cat` of the file through exec (the exec
// output relay), and `cp` of the file on the host. The daemon runs as its
// own process (bin/sbx next to the agent) so that the client's CPU is not
// its own. On a shared machine, -bench-cpu-shares and -boxes-cpu-shares
// (as for neighbours) keep other load from setting the figures: the load
// average is printed before and after.
func runFiles(n int, agentPath string, o neighbourOpts) error {
	fmt.Printf("load average at start: %s", loadAvg())
	defer func() { fmt.Printf("load average at end: %s", loadAvg()) }()
	if o.benchShares > 0 {
		undo, err := cpuGroup(o.benchShares)
		if err != nil {
			return err
		}
		defer undo()
	}
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sbxBin := filepath.Join(filepath.Dir(agentPath), "sbx")
	var extra []string
	if o.boxesShares > 0 {
		extra = append(extra, "--boxes-cpu-shares", strconv.FormatUint(o.boxesShares, 10))
	}
	d, err := startDaemonProc(sbxBin, filepath.Join(tmp, "data"), extra...)
	if err != nil {
		return err
	}
	defer d.stop()
	c := d.c
	ctx := context.Background()
	sb, err := c.Create(ctx, sbx.CreateOptions{Timeout: time.Hour, MemoryBytes: 1 << 30})
	if err != nil {
		return err
	}
	defer sb.Destroy(ctx) //nolint:errcheck
	data := make([]byte, filesBytes)
	if _, err := rand.Read(data); err != nil {
		return err
	}
	src := filepath.Join(tmp, "src.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		return err
	}
	const boxPath = "/tmp/bench.bin"
	rs := []*throughput{
		{name: "loopback TCP copy (floor)"},
		{name: "exec cat, stdout relay (floor)"},
		{name: "host cp of the file (floor)"},
		{name: "Go SDK upload"},
		{name: "Go SDK download"},
		{name: "sbx cp host→box"},
		{name: "sbx cp box→host"},
		{name: "Python SDK upload (write)"},
		{name: "Python SDK download (download_file)"},
		{name: "Python SDK read() to bytes"},
	}
	loop, execCat, hostCp, up, down, cpIn, cpOut := rs[0], rs[1], rs[2], rs[3], rs[4], rs[5], rs[6]
	pyUp, pyDown, pyRead := rs[7], rs[8], rs[9]
	var pyCPU pythonCPU
	py := pythonBenchAvailable()
	if !py {
		fmt.Printf("(Python SDK not measured: %s or %s missing; run from the repository root)\n", pythonBin, pythonBench)
		rs = rs[:7]
	}
	cp := func(from, to string) func() error {
		return func() error {
			cmd := exec.Command(sbxBin, "cp", from, to)
			cmd.Env = append(os.Environ(), "SBX_ADDR="+d.addr)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("sbx cp %s %s: %w: %s", from, to, err, out)
			}
			return nil
		}
	}
	dst := filepath.Join(tmp, "dst.bin")
	samples := max(3, n/8)
	for range samples {
		steps := []struct {
			t *throughput
			f func() error
		}{
			{loop, func() error { return loopbackCopy(data) }},
			{up, func() error {
				k, err := sb.Upload(ctx, boxPath, bytes.NewReader(data), 0o644)
				if err == nil && k != filesBytes {
					err = fmt.Errorf("uploaded %d bytes, want %d", k, filesBytes)
				}
				return err
			}},
			{down, func() error {
				var cw countWriter
				err := sb.Download(ctx, boxPath, &cw)
				if err == nil && cw.n != filesBytes {
					err = fmt.Errorf("downloaded %d bytes, want %d", cw.n, filesBytes)
				}
				return err
			}},
			{execCat, func() error {
				var cw countWriter
				st, err := sb.Exec(ctx, sbx.ExecOptions{Argv: []string{"cat", boxPath}, Stdout: &cw})
				if err == nil && (st.Code != 0 || cw.n != filesBytes) {
					err = fmt.Errorf("cat: exit %d, %d bytes, want 0 and %d", st.Code, cw.n, filesBytes)
				}
				return err
			}},
			{hostCp, func() error {
				if out, err := exec.Command("cp", src, filepath.Join(tmp, "hostcp.bin")).CombinedOutput(); err != nil {
					return fmt.Errorf("cp: %w: %s", err, out)
				}
				return nil
			}},
			{cpIn, cp(src, sb.ID+":"+boxPath)},
			{cpOut, cp(sb.ID+":"+boxPath, dst)},
		}
		for _, s := range steps {
			if err := s.t.rate(filesBytes, s.f); err != nil {
				return err
			}
		}
		if py {
			if err := pythonFiles(d.addr, sb.ID, src, pyUp, pyDown, pyRead, &pyCPU); err != nil {
				return err
			}
		}
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("sbx cp round trip changed the file")
	}
	printFiles(samples, rs...)
	if py {
		fmt.Printf("Python client CPU per 100 MiB (p50) = %.0f ms up / %.0f ms down / %.0f ms read() (the rest of the wall time is waiting on the daemon)\n",
			p50(pyCPU.up)*1000, p50(pyCPU.down)*1000, p50(pyCPU.read)*1000)
	}
	return nil
}

// pythonCPU is the CPU seconds the Python bench process spent per sample.
type pythonCPU struct{ up, down, read []float64 }

func p50(xs []float64) float64 { return throughput{mibs: xs}.p50() }

func printFiles(samples int, rs ...*throughput) {
	fmt.Printf("100 MiB of random bytes, %d samples each (p50)\n", samples)
	for _, r := range rs {
		fmt.Printf("  %-34s %8.0f MiB/s\n", r.name, r.p50())
	}
	loop, hostCp, up, down, cpIn, cpOut := rs[0].p50(), rs[2].p50(), rs[3].p50(), rs[4].p50(), rs[5].p50(), rs[6].p50()
	fmt.Printf("SDK upload / download             = %.0f / %.0f MiB/s  (target ≥ 500; %.2f / %.2f of loopback TCP, %.2f / %.2f of host cp)\n",
		up, down, up/loop, down/loop, up/hostCp, down/hostCp)
	fmt.Printf("sbx cp in / out                   = %.0f / %.0f MiB/s  (%.2f / %.2f of the SDK)\n",
		cpIn, cpOut, cpIn/up, cpOut/down)
	if len(rs) > 8 {
		fmt.Printf("Python SDK upload / download      = %.0f / %.0f MiB/s  (target ≥ 500; %.2f / %.2f of the Go SDK)\n",
			rs[7].p50(), rs[8].p50(), rs[7].p50()/up, rs[8].p50()/down)
	}
}

func pythonBenchAvailable() bool {
	for _, p := range []string{pythonBin, pythonBench} {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// pythonFiles runs one sample of each Python SDK step (timed inside the
// script, so the interpreter's start is not counted) and records them.
func pythonFiles(addr, sandbox, src string, up, down, read *throughput, cpu *pythonCPU) error {
	cmd := exec.Command(pythonBin, pythonBench, "--addr", addr, "--sandbox", sandbox, "--src", src, "--samples", "1")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("python SDK bench: %w: %s", err, stderr.Bytes())
	}
	var got map[string][]float64
	if err := json.Unmarshal(out, &got); err != nil {
		return fmt.Errorf("python SDK bench: reading its output %q: %w", out, err)
	}
	for _, s := range []struct {
		key string
		t   *throughput
	}{{"upload", up}, {"download", down}, {"read", read}} {
		if len(got[s.key]) == 0 {
			return fmt.Errorf("python SDK bench: no %q figure in %q", s.key, out)
		}
		s.t.mibs = append(s.t.mibs, got[s.key]...)
	}
	cpu.up = append(cpu.up, got["cpu_upload"]...)
	cpu.down = append(cpu.down, got["cpu_download"]...)
	cpu.read = append(cpu.read, got["cpu_read"]...)
	return nil
}

// loopbackCopy sends data over a loopback TCP connection to a reader that
// discards it: the floor of any network data path on this machine.
func loopbackCopy(data []byte) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		k, err := io.Copy(io.Discard, c)
		if err == nil && k != int64(len(data)) {
			err = fmt.Errorf("loopback: got %d bytes, want %d", k, len(data))
		}
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	if _, err := c.Write(data); err != nil {
		c.Close()
		return err
	}
	c.Close()
	return <-done
}
