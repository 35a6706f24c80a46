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

// benchNetwork measures cold create→ready with network mode none and with
// public (from the namespace pool) on a daemon with networking on.
func benchNetwork(ctx context.Context, dataDir, agentPath, runtimeBin string, n int) (none, public result, err error) {
	const pool = 4
	withNet := func(c *daemon.Config) {
		c.Network, c.NetBridge, c.NetSubnet, c.NetTable, c.NetPool = true, benchBridge, benchSubnet, benchTable, pool
		c.DNSUpstreams = []string{"127.0.0.1:53"} // never asked: the bench resolves nothing
	}
	c, stop, err := startDaemon(dataDir, agentPath, runtimeBin, 0, withNet)
	if err != nil {
		return none, public, err
	}
	defer removeBenchNetwork(dataDir)
	defer stop()
	var boxes []*sbx.Sandbox
	create := func(mode string) func() error {
		return func() error {
			sb, err := c.Create(ctx, sbx.CreateOptions{Network: &sbx.NetworkPolicy{Mode: mode}})
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
		return none, public, err
	}
	destroyAll()
	if public, err = measure("sbx create→ready, network public", n, create("public"), settle); err != nil {
		return none, public, err
	}
	destroyAll()
	return none, public, nil
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
