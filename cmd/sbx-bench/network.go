package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/sbxdev/sbx/internal/daemon"
	"github.com/sbxdev/sbx/internal/network"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// Bench network: a bridge, subnet and table of its own, removed at the end.
const (
	benchBridge = "sbxbench0"
	benchSubnet = "10.216.0.0/24"
	benchTable  = "sbxbench"
)

// benchNetwork measures cold create→ready with network mode none, with
// public (from the namespace pool) and with an allow policy (egress proxy
// redirection on) on a daemon with networking on.
func benchNetwork(ctx context.Context, dataDir, agentPath, runtimeBin string, n int) (none, public, allow result, err error) {
	const pool = 4
	withNet := func(c *daemon.Config) {
		c.Network, c.NetBridge, c.NetSubnet, c.NetTable, c.NetPool = true, benchBridge, benchSubnet, benchTable, pool
		c.DNSUpstreams = []string{"127.0.0.1:53"} // never asked: the bench resolves nothing
	}
	c, stop, err := startDaemon(dataDir, agentPath, runtimeBin, 0, withNet)
	if err != nil {
		return none, public, allow, err
	}
	defer removeBenchNetwork(dataDir)
	defer stop()
	var boxes []*sbx.Sandbox
	create := func(mode string) func() error {
		return func() error {
			p := &sbx.NetworkPolicy{Mode: mode}
			if mode == "allow" {
				p.AllowDomains = []string{"example.com", "*.github.com"}
			}
			sb, err := c.Create(ctx, sbx.CreateOptions{Network: p})
			if err == nil {
				boxes = append(boxes, sb)
			}
			return err
		}
	}
	destroyAll := func() {
		for _, b := range boxes {
			_ = b.Destroy(ctx)
		}
		boxes = nil
	}
	// The modes take turns, so that the machine's drift does not land on
	// one of them. Between rounds the round's boxes go (so every round
	// starts with as many boxes) and a pause lets the pool refill.
	settle := func() error { destroyAll(); time.Sleep(100 * time.Millisecond); return nil }
	rs, err := measureTogether(n,
		task{"sbx create→ready, network none", create("none")},
		task{"sbx create→ready, network public", create("public")},
		task{"sbx create→ready, network allow", create("allow")},
		task{"", settle},
	)
	destroyAll()
	if err != nil {
		return none, public, allow, err
	}
	return rs[0], rs[1], rs[2], nil
}

// removeBenchNetwork deletes the bench's bridge, table and namespaces.
func removeBenchNetwork(dataDir string) {
	m, err := network.New(context.Background(), network.Config{
		StateDir: filepath.Join(dataDir, "network"), Bridge: benchBridge, Subnet: benchSubnet, Table: benchTable,
		DNSUpstreams: []string{"127.0.0.1:53"}, Logger: slog.New(slog.DiscardHandler),
	})
	if err == nil {
		err = m.Remove()
	}
	if err != nil {
		fmt.Println("sbx-bench: removing the bench network:", err)
	}
}

// runNetwork runs only the network measurements.
func runNetwork(n int, agentPath, runtimeBin string) error {
	agentPath, tmp, err := benchSetup(agentPath)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	none, public, allow, err := benchNetwork(context.Background(), filepath.Join(tmp, "data-net"), agentPath, runtimeBin, n)
	if err != nil {
		return err
	}
	printResults(none, public, allow)
	printNetwork(none, public, allow)
	return nil
}

// printNetwork prints what networking adds to create→ready.
func printNetwork(none, public, allow result) {
	fmt.Printf("networking adds (public - none)   = %s  (p50; target ≤ 2 ms)\n", ms(public.p(0.5)-none.p(0.5)))
	fmt.Printf("networking adds (allow - none)    = %s  (p50; target ≤ 2 ms; egress proxy redirection on)\n", ms(allow.p(0.5)-none.p(0.5)))
}
