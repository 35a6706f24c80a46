package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/sbxdev/sbx/internal/daemon"
	"github.com/sbxdev/sbx/internal/server"
)

func TestCheckLimits(t *testing.T) {
	valid := func() daemon.Config {
		var cfg daemon.Config
		cfg.NetLimits.DNSQueriesPerSec, cfg.NetLimits.DNSInFlight, cfg.NetLimits.DNSTCPConns = 1, 1, 1
		cfg.NetLimits.DNSTCPIdleTimeout, cfg.NetLimits.EgressConns, cfg.NetLimits.EgressIdleTimeout = 1, 1, 1
		cfg.ProxyMaxConns = 1
		cfg.StateCreatingGrace, cfg.StateTeardownGrace = time.Minute, time.Minute
		cfg.StreamLimits = server.StreamLimits{ExecsPerSandbox: 256, FilesPerSandbox: 64, BackgroundPerSandbox: 64,
			RelayBytesPerSecond: server.DefaultRelayBytesPerSecond}
		return cfg
	}
	for _, tc := range []struct {
		name    string
		change  func(*daemon.Config)
		wantErr string
	}{
		{"defaults", func(*daemon.Config) {}, ""},
		{"no file calls", func(c *daemon.Config) { c.StreamLimits.FilesPerSandbox = 0 }, "--file-max-streams must be positive"},
		{"more file calls than the agent window holds", func(c *daemon.Config) { c.StreamLimits.FilesPerSandbox = 65 }, "--file-max-streams 65: at most 64"},
		{"negative exec streams", func(c *daemon.Config) { c.StreamLimits.ExecsPerSandbox = -1 }, "--exec-max-streams must be positive"},
		{"stats interval too short", func(c *daemon.Config) { c.StatsInterval = time.Millisecond }, "--stats-interval 1ms: want 100ms to 1m"},
		{"stats interval too long", func(c *daemon.Config) { c.StatsInterval = time.Hour }, "--stats-interval 1h0m0s: want 100ms to 1m"},
		{"no background processes", func(c *daemon.Config) { c.StreamLimits.BackgroundPerSandbox = 0 }, "--exec-max-background must be positive"},
		{"more background processes than the agent keeps", func(c *daemon.Config) { c.StreamLimits.BackgroundPerSandbox = 1025 }, "--exec-max-background 1025: at most 1024"},
		{"no relay budget", func(c *daemon.Config) { c.StreamLimits.RelayBytesPerSecond = 0 }, "--exec-relay-rate must be positive"},
		{"no creating grace", func(c *daemon.Config) { c.StateCreatingGrace = 0 }, "--state-creating-grace 0s, --state-teardown-grace 1m0s: want positive durations"},
		{"negative teardown grace", func(c *daemon.Config) { c.StateTeardownGrace = -time.Second }, "--state-teardown-grace -1s: want positive durations"},
		{"pool max below floor", func(c *daemon.Config) { c.WarmPool, c.WarmPoolMax = 4, 2 }, "--warm-pool-max 2 is below --warm-pool 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			err := checkLimits(cfg)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("checkLimits: %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("checkLimits: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
