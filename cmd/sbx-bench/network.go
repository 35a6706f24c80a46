package main

import (
	"context"
	"fmt"
	"log/slog"
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
	settle := func() { time.Sleep(100 * time.Millisecond) } // the pool refills, veths go away
	if none, err = measure("sbx create→ready, network none", n, create("none"), settle); err != nil {
		return none, public, allow, err
	}
	destroyAll()
	if public, err = measure("sbx create→ready, network public", n, create("public"), settle); err != nil {
		return none, public, allow, err
	}
	destroyAll()
	if allow, err = measure("sbx create→ready, network allow", n, create("allow"), settle); err != nil {
		return none, public, allow, err
	}
	destroyAll()
	return none, public, allow, nil
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
