package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/sbxdev/sbx/internal/daemon"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// runRuntimes measures the two isolation tiers side by side on one daemon:
// create→ready, create→first command, exec `true`, exec `python3 -c pass`, a 100 MiB file written
// and read back, and a new sandbox's memory, oci and gvisor taking turns;
// and `runsc run` of /bin/true on a trivial bundle, gVisor's own floor.
// runsc is .tools/runsc (scripts/install-runsc.sh), $SBX_RUNSC or on PATH.
func runRuntimes(n int, agentPath, runtimeBin string, boxesShares uint64) error {
	runsc := os.Getenv("SBX_RUNSC")
	if runsc == "" {
		if abs, err := filepath.Abs(".tools/runsc"); err == nil {
			if _, err := os.Stat(abs); err == nil {
				runsc = abs
			}
		}
	}
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// -boxes-cpu-shares: both runtimes' boxes weigh that much together
	// (the default, an eighth of a host process, leaves them little CPU on
	// a machine other load keeps busy, and gVisor's boot runs in the box's
	// cgroup while runc's does not).
	c, stop, err := startDaemon(filepath.Join(tmp, "data"), agentPath, runtimeBin, 0, func(cfg *daemon.Config) {
		cfg.RunscPath, cfg.BoxesCPUShares = runsc, boxesShares
	})
	if err != nil {
		return err
	}
	defer stop()
	ctx := context.Background()
	v, err := c.Version(ctx)
	if err != nil {
		return err
	}
	for _, r := range v.GetRuntimes() {
		fmt.Printf("runtime %s: healthy=%v: %s\n", r.GetName(), r.GetHealthy(), r.GetHealthDetail())
		if !r.GetHealthy() {
			return fmt.Errorf("runtime %s is unhealthy: %s", r.GetName(), r.GetHealthDetail())
		}
	}
	runtimes := []string{"oci", "gvisor"}
	var tasks []task
	for _, rt := range runtimes {
		tasks = append(tasks, task{"create→ready " + rt, func() error {
			sb, err := c.Create(ctx, sbx.CreateOptions{Runtime: rt})
			if err != nil {
				return err
			}
			return sb.Destroy(ctx)
		}})
	}
	for _, rt := range runtimes {
		tasks = append(tasks, task{"create→first command " + rt, func() error {
			sb, err := c.Create(ctx, sbx.CreateOptions{Runtime: rt})
			if err != nil {
				return err
			}
			res, err := sb.Run(ctx, "true")
			if err == nil && res.Code != 0 {
				err = fmt.Errorf("true exited %d: %s", res.Code, res.Stderr)
			}
			return errors.Join(err, sb.Destroy(ctx))
		}})
	}
	creates, err := measureTogether(n, tasks...)
	if err != nil {
		return err
	}
	boxes := map[string]*sbx.Sandbox{}
	defer func() {
		for _, b := range boxes {
			_ = b.Destroy(ctx)
		}
	}()
	for _, rt := range runtimes {
		if boxes[rt], err = c.Create(ctx, sbx.CreateOptions{Runtime: rt}); err != nil {
			return fmt.Errorf("create %s box: %w", rt, err)
		}
	}
	run := func(rt string, argv ...string) func() error {
		return func() error {
			res, err := boxes[rt].Run(ctx, argv...)
			if err == nil && res.Code != 0 {
				err = fmt.Errorf("%q exited %d: %s", argv, res.Code, res.Stderr)
			}
			return err
		}
	}
	var execTasks, pyTasks, fileTasks []task
	data := make([]byte, 100<<20)
	for i := range data {
		data[i] = byte(i)
	}
	for _, rt := range runtimes {
		execTasks = append(execTasks, task{"exec true " + rt, run(rt, "true")})
		pyTasks = append(pyTasks, task{"exec python3 -c pass " + rt, run(rt, "python3", "-c", "pass")})
		fileTasks = append(fileTasks, task{"write+read 100 MiB " + rt, func() error {
			if err := boxes[rt].WriteFile(ctx, "/tmp/big", data, 0o644); err != nil {
				return err
			}
			got, err := boxes[rt].ReadFile(ctx, "/tmp/big")
			if err == nil && len(got) != len(data) {
				err = fmt.Errorf("read back %d bytes, want %d", len(got), len(data))
			}
			return err
		}})
	}
	execs, err := measureTogether(n*5, execTasks...)
	if err != nil {
		return err
	}
	pys, err := measureTogether(n, pyTasks...)
	if err != nil {
		return err
	}
	files, err := measureTogether(max(n/8, 3), fileTasks...)
	if err != nil {
		return err
	}
	var floor result
	if runsc != "" {
		if floor, err = runscFloor(runsc, filepath.Join(tmp, "floor"), n); err != nil {
			return err
		}
	}
	all := append(append(append(append(creates, execs...), pys...), files...), floor)
	printResults(all...)
	mem := map[string]float64{}
	for _, rt := range runtimes {
		fresh, err := c.Create(ctx, sbx.CreateOptions{Runtime: rt})
		if err != nil {
			return err
		}
		got, err := c.Get(ctx, fresh.Info.GetId())
		if err == nil {
			mem[rt] = float64(got.Info.GetStats().GetMemoryBytes()) / (1 << 20)
			fmt.Printf("memory of a new idle %s sandbox: %.1f MiB\n", rt, mem[rt])
		}
		_ = fresh.Destroy(ctx)
	}
	if mem["oci"] > 0 {
		fmt.Printf("idle memory gvisor / oci = %.2fx\n", mem["gvisor"]/mem["oci"])
	}
	fmt.Printf("gvisor / oci: create→ready %.2fx, create→first command %.2fx, exec true %.2fx, exec python3 %.2fx, write+read 100 MiB %.2fx\n",
		ratio(creates[1], creates[0]), ratio(creates[3], creates[2]), ratio(execs[1], execs[0]), ratio(pys[1], pys[0]), ratio(files[1], files[0]))
	fmt.Printf("gvisor create→ready / runsc run true = %.2fx\n", ratio(creates[1], floor))
	return nil
}

// runscFloor times `runsc run` of /bin/true in a bundle whose rootfs is
// the host's /usr, /lib, /lib64 and /bin bound read-only.
func runscFloor(runsc, dir string, n int) (result, error) {
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return result{}, err
	}
	var mounts string
	for _, d := range []string{"/usr", "/lib", "/lib64", "/bin"} {
		if _, err := os.Stat(d); err == nil {
			mounts += fmt.Sprintf(`,{"destination":%q,"type":"bind","source":%q,"options":["rbind","ro"]}`, d, d)
		}
	}
	cfg := `{"ociVersion":"1.0.2","process":{"args":["/bin/true"],"cwd":"/","env":["PATH=/usr/bin:/bin"]},` +
		`"root":{"path":"rootfs","readonly":true},"mounts":[{"destination":"/proc","type":"proc","source":"proc"}` + mounts + `],` +
		`"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"},{"type":"network"}]}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		return result{}, err
	}
	root := filepath.Join(dir, "state")
	defer func() {
		_ = exec.Command("umount", filepath.Join(root, "null-netns")).Run()
	}()
	i := 0
	return measure("runsc run /bin/true (gVisor's floor)", n, func() error {
		i++
		out, err := exec.Command(runsc, "--root", root, "--network", "none", "--host-settings", "ignore",
			"run", "--bundle", dir, "floor-"+strconv.Itoa(i)).CombinedOutput()
		if err != nil {
			return errors.Join(err, errors.New(string(out)))
		}
		return nil
	})
}
