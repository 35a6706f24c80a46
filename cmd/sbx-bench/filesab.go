package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// runFilesAB is `-only files -baseline DIR`: the file data path of two
// builds in one run, the old daemon and agent (in DIR) and the new ones
// (next to agentPath) taking turns sample by sample, each next to the
// loopback TCP and host cp floors of the same rounds. For every path it
// reports MiB/s and the CPU seconds all the parties spent per 100 MiB: the
// client (the bench's own process for the SDK, the sbx process for
// `sbx cp`), the daemon process and the box (its cgroup's cpuacct: the
// agent and its file writer).
func runFilesAB(n int, agentPath, baseDir string, o neighbourOpts) error {
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
	baseDir, err = filepath.Abs(baseDir)
	if err != nil {
		return err
	}
	var extra []string
	if o.boxesShares > 0 {
		extra = append(extra, "--boxes-cpu-shares", strconv.FormatUint(o.boxesShares, 10))
	}
	type side struct {
		name, bin, dataDir string
		d                  *daemonProc
		sb                 *sbx.Sandbox
	}
	sides := []*side{{name: "old", bin: filepath.Join(baseDir, "sbx")}, {name: "new", bin: filepath.Join(filepath.Dir(agentPath), "sbx")}}
	defer func() {
		for _, s := range sides {
			if s.sb != nil {
				_ = s.sb.Destroy(context.Background())
			}
			if s.d != nil {
				s.d.stop()
			}
		}
	}()
	ctx := context.Background()
	for _, s := range sides {
		s.dataDir = filepath.Join(tmp, s.name)
		if s.d, err = startDaemonProc(s.bin, s.dataDir, extra...); err != nil {
			return fmt.Errorf("%s daemon: %w", s.name, err)
		}
		if s.sb, err = s.d.c.Create(ctx, sbx.CreateOptions{Timeout: time.Hour, MemoryBytes: 1 << 30}); err != nil {
			return fmt.Errorf("%s daemon: create: %w", s.name, err)
		}
	}
	data := make([]byte, filesBytes)
	if _, err := rand.Read(data); err != nil {
		return err
	}
	src := filepath.Join(tmp, "src.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		return err
	}
	const boxPath = "/tmp/bench.bin"

	// sample is one path's MiB/s and CPU seconds per 100 MiB, by party.
	type sample struct{ mibs, client, daemon, box []float64 }
	results := map[string]*sample{}
	var order []string
	record := func(name string, wall time.Duration, client, daemon, box time.Duration) {
		r := results[name]
		if r == nil {
			r = &sample{}
			results[name] = r
			order = append(order, name)
		}
		per := float64(filesBytes) / (100 << 20)
		r.mibs = append(r.mibs, float64(filesBytes)/(1<<20)/wall.Seconds())
		r.client = append(r.client, client.Seconds()/per)
		r.daemon = append(r.daemon, daemon.Seconds()/per)
		r.box = append(r.box, box.Seconds()/per)
	}
	// timed runs f and records it; f returns the CPU its child used, if
	// it ran one (else the bench's own CPU counts as the client's).
	timed := func(name string, s *side, f func() (time.Duration, error)) error {
		self0 := selfCPU()
		var d0, b0 time.Duration
		if s != nil {
			d0, _ = processCPU(s.d.cmd.Process.Pid)
			b0 = boxCPU(s.dataDir, s.sb.ID)
		}
		t0 := time.Now()
		child, err := f()
		wall := time.Since(t0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		client := child
		if child == 0 {
			client = selfCPU() - self0
		}
		var dcpu, bcpu time.Duration
		if s != nil {
			d1, _ := processCPU(s.d.cmd.Process.Pid)
			dcpu, bcpu = d1-d0, boxCPU(s.dataDir, s.sb.ID)-b0
		}
		record(name, wall, client, dcpu, bcpu)
		return nil
	}
	cp := func(s *side, from, to string) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			cmd := exec.Command(s.bin, "cp", from, to)
			cmd.Env = append(os.Environ(), "SBX_ADDR="+s.d.addr)
			if out, err := cmd.CombinedOutput(); err != nil {
				return 0, fmt.Errorf("sbx cp %s %s: %w: %s", from, to, err, out)
			}
			return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
		}
	}
	dst := filepath.Join(tmp, "dst.bin")
	samples := max(3, n/8)
	for i := range samples {
		if err := timed("loopback TCP copy (floor)", nil, func() (time.Duration, error) { return 0, loopbackCopy(data) }); err != nil {
			return err
		}
		if err := timed("host cp of the file (floor)", nil, func() (time.Duration, error) {
			cmd := exec.Command("cp", src, filepath.Join(tmp, "hostcp.bin"))
			if out, err := cmd.CombinedOutput(); err != nil {
				return 0, fmt.Errorf("cp: %w: %s", err, out)
			}
			return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
		}); err != nil {
			return err
		}
		turn := sides
		if i%2 == 1 {
			turn = []*side{sides[1], sides[0]}
		}
		for _, s := range turn {
			steps := []struct {
				name string
				f    func() (time.Duration, error)
			}{
				{"Go SDK upload", func() (time.Duration, error) {
					k, err := s.sb.Upload(ctx, boxPath, bytes.NewReader(data), 0o644)
					if err == nil && k != filesBytes {
						err = fmt.Errorf("uploaded %d bytes, want %d", k, filesBytes)
					}
					return 0, err
				}},
				{"Go SDK download", func() (time.Duration, error) {
					var cw countWriter
					err := s.sb.Download(ctx, boxPath, &cw)
					if err == nil && cw.n != filesBytes {
						err = fmt.Errorf("downloaded %d bytes, want %d", cw.n, filesBytes)
					}
					return 0, err
				}},
				{"sbx cp host→box", cp(s, src, s.sb.ID+":"+boxPath)},
				{"sbx cp box→host", cp(s, s.sb.ID+":"+boxPath, dst)},
			}
			for _, st := range steps {
				if err := timed(s.name+": "+st.name, s, st.f); err != nil {
					return err
				}
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, data) {
				return fmt.Errorf("%s: sbx cp round trip changed the file", s.name)
			}
		}
	}
	fmt.Printf("100 MiB of random bytes, %d samples each (p50); CPU seconds per 100 MiB: all = client + daemon + box (agent and its file writer)\n", samples)
	fmt.Printf("  %-34s %8s %7s %7s %7s %7s\n", "", "MiB/s", "all", "client", "daemon", "box")
	for _, name := range order {
		r := results[name]
		c, d, b := p50(r.client), p50(r.daemon), p50(r.box)
		fmt.Printf("  %-34s %8.0f %7.3f %7.3f %7.3f %7.3f\n", name, p50(r.mibs), c+d+b, c, d, b)
	}
	for _, path := range []string{"Go SDK upload", "Go SDK download", "sbx cp host→box", "sbx cp box→host"} {
		o, nw := results["old: "+path], results["new: "+path]
		fmt.Printf("new / old %-24s MiB/s %.2fx, CPU per 100 MiB %.2fx\n", path+":", p50(nw.mibs)/p50(o.mibs),
			(p50(nw.client)+p50(nw.daemon)+p50(nw.box))/(p50(o.client)+p50(o.daemon)+p50(o.box)))
	}
	return nil
}

// selfCPU is this process's user+system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// boxCPU is the CPU time of box id's cgroup (its agent, the file writer
// and user code), found from its agent's pid (oci boxes); 0 if unknown.
func boxCPU(dataDir, id string) time.Duration {
	b, err := os.ReadFile(filepath.Join(dataDir, "oci", "boxes", id, "init.pid"))
	if err != nil {
		return 0
	}
	cg, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/cgroup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(cg), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(","+parts[1]+",", ",cpuacct,") {
			continue
		}
		for _, root := range []string{"/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"} {
			u, err := os.ReadFile(filepath.Join(root, parts[2], "cpuacct.usage"))
			if err == nil {
				ns, _ := strconv.ParseInt(strings.TrimSpace(string(u)), 10, 64)
				return time.Duration(ns)
			}
		}
	}
	return 0
}
