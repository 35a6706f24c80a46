package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxdev/sbx/internal/daemon"
	"github.com/sbxdev/sbx/internal/loadgen"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

var (
	loadClients  = flag.Int("load-clients", 64, "-only load: concurrent clients")
	loadDuration = flag.Duration("load-duration", 60*time.Second, "-only load: how long the clients make calls")
)

// runLoad drives a daemon of its own (no warm pool, networking off) with
// -load-clients clients making mixed calls (create, exec, file write and
// read, list, get, destroy) for -load-duration and prints calls, errors,
// p50 and p99 per call. Any error other than the deliberate ones (a get of
// a sandbox that does not exist, which must say NotFound) fails the run.
func runLoad(_ int, agentPath, runtimeBin string) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var addr string
	c, stop, err := startDaemon(filepath.Join(tmp, "data"), agentPath, runtimeBin, 0, func(cfg *daemon.Config) {
		ready := cfg.Ready
		cfg.Ready = func(a string) { addr = a; ready(a) }
	})
	if err != nil {
		return err
	}
	defer stop()
	c.Close()
	fmt.Printf("load: %d clients × %s of mixed calls\n", *loadClients, *loadDuration)
	rep := loadgen.Run(context.Background(), loadgen.Config{Clients: *loadClients, Duration: *loadDuration, Seed: uint64(time.Now().UnixNano())},
		func() *sbx.Client { return sbx.NewClient(addr) })
	fmt.Println(rep)
	if rep.Unexpected > 0 {
		return fmt.Errorf("load: %d unexpected errors", rep.Unexpected)
	}
	return nil
}
