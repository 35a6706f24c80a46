// Command quickstart shows sbx from Go: it creates a sandbox, runs Python in
// it with output streamed as it is printed, writes a file and reads it back,
// and destroys the sandbox; then it shows the daemon's isolation tiers (oci
// and gvisor): each runtime's health and capabilities, and the same
// commands in a sandbox on each. Run it with `make run`, or against a running
// daemon with `go run ./examples/quickstart -addr 127.0.0.1:7777`.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func main() {
	addr := flag.String("addr", "", "daemon address (default $SBX_ADDR or 127.0.0.1:7777)")
	flag.Parse()
	if err := run(*addr); err != nil {
		log.Fatal(err)
	}
	if err := tiers(*addr); err != nil {
		log.Fatal(err)
	}
}

// tiers lists the daemon's runtimes and runs the same commands in a
// sandbox on each healthy one: the kernel the sandbox sees, and how long a
// create and an exec take there.
func tiers(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := sbx.NewClient(addr)
	v, err := c.Version(ctx)
	if err != nil {
		return fmt.Errorf("version: %w", err)
	}
	fmt.Println("--- isolation tiers ---")
	var healthy []string
	for _, r := range v.GetRuntimes() {
		state, def := "healthy", ""
		if !r.GetHealthy() {
			state = "unavailable"
		} else {
			healthy = append(healthy, r.GetName())
		}
		if r.GetIsDefault() {
			def = " (default)"
		}
		fmt.Printf("runtime %s%s: %s: %s\n  capabilities: %s\n", r.GetName(), def, state, r.GetHealthDetail(), strings.Join(r.GetCapabilities(), ", "))
	}
	if !slices.Contains(healthy, "gvisor") {
		fmt.Println("(gvisor is unavailable: scripts/install-runsc.sh builds runsc into .tools/, then restart the daemon)")
	}
	for _, rt := range healthy {
		start := time.Now()
		sb, err := c.Create(ctx, sbx.CreateOptions{Runtime: rt, Timeout: time.Minute})
		if err != nil {
			return fmt.Errorf("create on %s: %w", rt, err)
		}
		created := time.Since(start)
		res, err := sb.RunShell(ctx, "cat /proc/version")
		start = time.Now()
		if err == nil {
			_, err = sb.Run(ctx, "true")
		}
		execTook := time.Since(start)
		if derr := sb.Destroy(context.WithoutCancel(ctx)); err == nil {
			err = derr
		}
		if err != nil {
			return fmt.Errorf("run on %s: %w", rt, err)
		}
		fmt.Printf("%s: created in %s, exec true in %s, kernel: %s", rt, created.Round(time.Millisecond),
			execTook.Round(100*time.Microsecond), res.Stdout)
	}
	return nil
}

func run(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := sbx.NewClient(addr)

	start := time.Now()
	sb, err := c.Create(ctx, sbx.CreateOptions{
		Labels:      map[string]string{"example": "quickstart"},
		MemoryBytes: 256 << 20,
		CPUs:        1,
		Timeout:     5 * time.Minute,
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer func() {
		if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
			log.Printf("destroy: %v", err)
		}
		fmt.Println("destroyed", sb.ID)
	}()
	fmt.Printf("created sandbox %s in %s\n", sb.ID, time.Since(start).Round(time.Millisecond))

	// Output streams while the program runs: each line shows up a tenth of a second apart.
	fmt.Println("--- python3 (streamed) ---")
	st, err := sb.Exec(ctx, sbx.ExecOptions{
		Argv: []string{"python3", "-u", "-c", `
import sys, time, platform
print("hello from python", platform.python_version(), "inside", platform.node())
for i in range(3):
    print("tick", i, flush=True)
    time.sleep(0.1)
print("this goes to stderr", file=sys.stderr)
`},
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	fmt.Printf("--- exit code %d ---\n", st.Code)

	if err := sb.WriteFile(ctx, "/root/data/numbers.txt", []byte("3\n4\n5\n"), 0o644); err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	res, err := sb.RunShell(ctx, `python3 -c "print(sum(int(l) for l in open('/root/data/numbers.txt')))" > /root/data/sum.txt`)
	if err != nil || res.Code != 0 {
		return fmt.Errorf("sum: %v %s", err, res.Stderr)
	}
	sum, err := sb.ReadFile(ctx, "/root/data/sum.txt")
	if err != nil {
		return fmt.Errorf("read file: %w", err)
	}
	fmt.Printf("wrote numbers.txt, python summed them: %s", sum)
	return nil
}
