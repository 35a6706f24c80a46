package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/daemon"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/metrics"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/server"
	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newServe(a *app) *cobra.Command {
	var cfg daemon.Config
	var logLevel, tokenFile, maxLayer, tenantsFile, boxLimits, reqPerTenant, reqTotal, defMemory string
	var defCPUs float64
	var tenantPullAllow []string
	var boxAPIPort uint16
	var egressPorts []uint
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the sbx daemon",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return err
			}
			for _, p := range egressPorts {
				if p == 0 || p > 65535 {
					return fmt.Errorf("--egress-ports: %d is not a TCP port", p)
				}
				cfg.EgressPorts = append(cfg.EgressPorts, uint16(p))
			}
			tok, err := readAuthToken(tokenFile)
			if err != nil {
				return err
			}
			cfg.AuthToken = tok
			cfg.BoxAPIPort = boxAPIPort
			if tenantsFile != "" {
				if tok != "" {
					return fmt.Errorf("--tenants replaces the single API token: drop --auth-token-file / SBX_AUTH_TOKEN")
				}
				if cfg.Tenants, err = tenant.Open(tenantsFile); err != nil {
					return err
				}
			}
			if err := checkLimits(cfg); err != nil {
				return err
			}
			for _, c := range tenantPullAllow {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					return fmt.Errorf("--tenant-pull-allow %q: want a CIDR such as 10.0.0.5/32: %w", c, err)
				}
				cfg.TenantPullAllow = append(cfg.TenantPullAllow, p.Masked())
			}
			if cfg.BoxLimits, err = idmap.ParseLimits(boxLimits); err != nil {
				return fmt.Errorf("--box-kernel-limits: %w", err)
			}
			if cfg.Defaults.MemoryBytes, err = parseSize(defMemory); err != nil || cfg.Defaults.MemoryBytes < 16<<20 {
				return fmt.Errorf("--default-memory %q: want a size of at least 16M, such as 512M", defMemory)
			}
			if defCPUs < 0.01 || defCPUs > 1024 {
				return fmt.Errorf("--default-cpus %v: want 0.01 to 1024", defCPUs)
			}
			cfg.Defaults.CPUMillis = int64(defCPUs * 1000)
			if cfg.MaxLayerBytes, err = parseSize(maxLayer); err != nil || cfg.MaxLayerBytes <= 0 {
				return fmt.Errorf("--max-layer-size %q: want a size such as 8G", maxLayer)
			}
			for _, b := range []struct {
				flag, val string
				dst       *int64
			}{{"--request-bytes-per-tenant", reqPerTenant, &cfg.RequestBytesPerTenant}, {"--request-bytes-total", reqTotal, &cfg.RequestBytesTotal}} {
				if *b.dst, err = parseSize(b.val); err != nil || *b.dst < 64<<20 {
					return fmt.Errorf("%s %q: want a size of at least 64M (the largest request message), such as 256M", b.flag, b.val)
				}
			}
			if cfg.RequestBytesTotal < cfg.RequestBytesPerTenant {
				return fmt.Errorf("--request-bytes-total %s is below --request-bytes-per-tenant %s", reqTotal, reqPerTenant)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: lvl}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if cfg.Tenants != nil {
				go reloadOnHUP(ctx, cfg.Tenants, tenantsFile, cfg.Logger)
			}
			return daemon.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", sbx.DefaultAddr, "API address host:port")
	f.StringVar(&cfg.DataDir, "data-dir", daemon.DefaultDataDir, "state directory")
	f.StringVar(&cfg.OCIRuntime, "oci-runtime", "", "OCI runtime binary (default: crun where the host allows it, else runc)")
	f.StringVar(&cfg.AgentPath, "agent", "", "sbx-agent binary (default: next to this executable)")
	f.StringVar(&cfg.RunscPath, "runsc", "", "gVisor's runsc binary for the gvisor runtime (default: on PATH, next to this executable, or ../.tools/runsc; scripts/install-runsc.sh builds it)")
	f.StringVar(&cfg.DefaultRuntime, "default-runtime", "oci", "runtime of sandboxes whose create names none: oci (runc, shared kernel), gvisor (gVisor's user-space kernel) or, with --k8s-namespace, kubernetes")
	f.StringVar(&cfg.Kubernetes.Namespace, "k8s-namespace", "", "add the kubernetes runtime: sandboxes as Pods in this namespace (needs --k8s-agent-image)")
	f.StringVar(&cfg.Kubernetes.Kubeconfig, "k8s-kubeconfig", "", "kubeconfig of the cluster for the kubernetes runtime (default: the in-cluster service account)")
	f.StringVar(&cfg.Kubernetes.AgentImage, "k8s-agent-image", "", "image holding this build's static sbx-agent at /sbx-agent, which each pod's init container installs")
	f.StringToStringVar(&cfg.Kubernetes.RuntimeClasses, "k8s-runtime-class", nil, "extra kubernetes runtime NAME=RUNTIMECLASS (e.g. kubernetes-gvisor=gvisor: sandboxes created with --runtime NAME get that runtimeClassName; repeatable)")
	f.StringToStringVar(&cfg.Kubernetes.Firewalls, "k8s-firewall", nil, "kubernetes runtime NAME=BACKEND of its pod firewall: nftables (default) or iptables (gVisor RuntimeClasses: runsc has no nftables and needs --net-raw; docs/DRIVERS.md); repeatable")
	f.StringVar(&cfg.Kubernetes.Instance, "k8s-instance", "", "label separating daemons that share a namespace: each cleans up only its own pods (replicas of one daemon share it; default \"default\")")
	f.StringArrayVar(&cfg.Kubernetes.WarmPool, "k8s-warm-pool", nil, "keep N pods of IMAGE ready for creates of that image with the default limits, on the kubernetes runtime or RUNTIME: [RUNTIME=]IMAGE=N (repeatable; replicas claim from each other's pods)")
	f.StringSliceVar(&cfg.Kubernetes.ClusterCIDRs, "k8s-cluster-cidrs", nil, "the cluster's own ranges (pod, service and node networks, every address a node has): sandboxes in modes public and allow never reach them, whatever their allow-list says (comma-separated or repeated; each pod also blocks its own node's InternalIP, pod network, gateway and the API server's ClusterIP)")
	f.DurationVar(&cfg.Kubernetes.PoolLease, "k8s-pool-lease", daemon.DefaultK8sPoolLease, "how long a replica's warm-pool Lease lasts unrenewed (it is renewed every third) before the other replicas delete the unclaimed pool pods it made: a replica killed with SIGKILL leaves none for longer (at least 3s)")
	f.BoolVar(&cfg.Kubernetes.UserNamespaces, "k8s-user-namespaces", false, "run sandbox pods with hostUsers: false (box root is not host root; needs the cluster's support)")
	f.StringVar(&cfg.State, "state", daemon.StateSQLite, "where sandbox records live: sqlite (a file in --data-dir, one daemon) or kubernetes (Secrets in --state-namespace, shared by replicas of the daemon behind one address; only the kubernetes runtimes)")
	f.StringVar(&cfg.StateNamespace, "state-namespace", "", "namespace of the records with --state kubernetes (default: --k8s-namespace)")
	f.DurationVar(&cfg.StateCreatingGrace, "state-creating-grace", sandbox.DefaultCreatingGrace, "with --state kubernetes: how long a sandbox may stay creating before another replica takes it for a dead replica's and deletes it with its pod (keep it above the slowest create, image pull included)")
	f.DurationVar(&cfg.StateTeardownGrace, "state-teardown-grace", sandbox.DefaultTeardownGrace, "with --state kubernetes: how long a destroyed sandbox's teardown may take before another replica takes it for a dead replica's and finishes it")
	f.StringVar(&defMemory, "default-memory", "512M", "memory limit of sandboxes created without --memory, and of warm-pool boxes (on kubernetes also the pods' memory request)")
	f.Float64Var(&defCPUs, "default-cpus", 1, "CPU limit of sandboxes created without --cpus, and of warm-pool boxes (on kubernetes also the pods' CPU request, which the node's allocatable CPU must hold)")
	f.DurationVar(&cfg.DefaultTimeout, "default-timeout", 5*time.Minute, "lifetime of sandboxes created without --timeout (0: unlimited)")
	f.IntVar(&cfg.WarmPool, "warm-pool", 2, "started sandboxes kept ready so creates with the host image are near-instant, at least (0: off)")
	f.DurationVar(&cfg.StatsInterval, "stats-interval", metrics.DefaultInterval, "how often the daemon samples every sandbox's usage for /metrics and `sbx stats` (each sandbox keeps 15 minutes of samples)")
	f.IntVar(&cfg.WarmPoolMax, "warm-pool-max", 0, fmt.Sprintf("how many started sandboxes the warm pool may grow to when creates come in bursts; it shrinks back to --warm-pool after 30 s without them (0: %d, or --warm-pool if larger)", sandbox.DefaultWarmPoolMax))
	f.BoolVar(&cfg.Network, "network", true, "give sandboxes networking (bridge, firewall, DNS forwarder); off: loopback only")
	f.StringVar(&cfg.NetBridge, "net-bridge", "sbx0", "bridge sandboxes attach to")
	f.StringVar(&cfg.NetSubnet, "net-subnet", "10.213.0.0/16", "IPv4 subnet of the bridge (the first address is the gateway)")
	f.StringVar(&cfg.NetTable, "net-table", "sbx", "nftables table (family inet) sbx owns")
	f.StringSliceVar(&cfg.DNSUpstreams, "dns-upstream", nil, "resolver host:port sandboxes' DNS is forwarded to (repeatable; default: the host's /etc/resolv.conf)")
	f.IntVar(&cfg.NetPool, "net-pool", 4, "network namespaces kept ready for fast creates (0: off)")
	f.UintSliceVar(&egressPorts, "egress-ports", []uint{80, 443}, "TCP ports sent through the egress proxy (host-name checks in allow mode, domain secrets)")
	f.StringSliceVar(&cfg.EgressRoots, "egress-ca", nil, "PEM file of extra CAs the egress proxy trusts when it re-originates intercepted TLS (repeatable; the host's roots are always trusted)")
	d := network.DefaultLimits
	f.IntVar(&cfg.NetLimits.DNSQueriesPerSec, "dns-qps", d.DNSQueriesPerSec, "DNS queries a second one sandbox may send the forwarder (bursts of twice as many pass; the excess is dropped)")
	f.IntVar(&cfg.NetLimits.DNSInFlight, "dns-inflight", d.DNSInFlight, "DNS queries of one sandbox the forwarder has upstream at once")
	f.IntVar(&cfg.NetLimits.DNSTCPConns, "dns-tcp-conns", d.DNSTCPConns, "TCP connections one sandbox may hold to the DNS forwarder")
	f.DurationVar(&cfg.NetLimits.DNSTCPIdleTimeout, "dns-tcp-idle-timeout", d.DNSTCPIdleTimeout, "how long a sandbox's TCP connection to the DNS forwarder may sit without a complete query")
	f.IntVar(&cfg.NetLimits.EgressConns, "egress-max-conns", d.EgressConns, "connections one sandbox may hold through the egress proxy")
	f.DurationVar(&cfg.NetLimits.EgressIdleTimeout, "egress-idle-timeout", d.EgressIdleTimeout, "close a connection through the egress proxy on which neither side has sent anything for this long")
	f.IntVar(&cfg.ProxyMaxConns, "proxy-max-conns", server.DefaultMaxConnsPerSandbox, "connections one sandbox may have open through the port proxy (HTTP requests in flight, WebSockets, raw TCP); the excess gets 503")
	f.Int64Var(&cfg.StreamLimits.RelayBytesPerSecond, "exec-relay-rate", server.DefaultRelayBytesPerSecond, "bytes per second of output (every command's, code run's, session command's and log follower's together, each event counted as 4 KiB more than its size) the daemon relays for one sandbox, bounding the daemon CPU a flood costs; past it the sandbox's writes wait")
	f.IntVar(&cfg.StreamLimits.ExecsPerSandbox, "exec-max-streams", server.DefaultExecsPerSandbox, "commands one sandbox may have running through the API at once (exec, exec -i, the SDKs' exec); the excess gets ResourceExhausted")
	f.IntVar(&cfg.StreamLimits.BackgroundPerSandbox, "exec-max-background", server.DefaultBackgroundPerSandbox, "background processes (exec -d, the SDKs' background=True) one sandbox may have running at once; the excess gets ResourceExhausted")
	f.IntVar(&cfg.StreamLimits.FilesPerSandbox, "file-max-streams", server.DefaultFilesPerSandbox, "file calls on one sandbox in flight at once (reads, writes, cp, tars, listings); the excess gets ResourceExhausted")
	f.StringVar(&tokenFile, "auth-token-file", "", "file holding the API token every request must carry as Authorization: Bearer (default: $SBX_AUTH_TOKEN; none: no auth, loopback only)")
	f.BoolVar(&cfg.InsecureNoAuth, "insecure-no-auth", false, "allow listening on a non-loopback address without a token")
	f.StringVar(&tenantsFile, "tenants", "", "JSON file of tenants, each with hashed API tokens (`sbx tenant hash-token`) and quotas; each token sees only its tenant's sandboxes (re-read on SIGHUP)")
	f.StringSliceVar(&tenantPullAllow, "tenant-pull-allow", nil, "CIDR of non-public addresses (e.g. a registry mirror on the private network) tenants' pulls may connect to (repeatable); otherwise a tenant's pull, auto-pull or build FROM reaches only public addresses other than the host's")
	f.BoolVar(&cfg.TenantPullCredentials, "tenant-pull-credentials", false, "let tenants' pulls use the daemon's registry logins (its docker config); otherwise they pull anonymously and no tenant gets an image only those logins can read")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate (chain) to serve the API over TLS (with --tls-key)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	f.Uint16Var(&boxAPIPort, "box-api-port", daemon.DefaultBoxAPIPort, "port on the network gateway where sandboxes created with --scoped-token reach the API (it accepts only their scoped tokens)")
	f.StringVar(&cfg.UIListen, "ui-listen", "auto", "address of the web dashboard (and the API it calls), an origin of its own that never serves sandbox ports: auto (--listen's host, the next port; none if taken) or off")
	f.StringVar(&cfg.ProxyDomain, "proxy-domain", "", "route <port>-<sandbox-id>.DOMAIN to sandbox ports (point a wildcard DNS name at the daemon)")
	f.BoolVar(&cfg.NoE2B, "no-e2b-api", false, "do not serve the E2B-compatible API (E2B's SDKs with E2B_API_URL/E2B_SANDBOX_URL pointing here; docs/E2B.md); with it on, ports 49983 and 49999 routed by header or host name are E2B's envd and code interpreter, not the sandbox's")
	f.StringVar(&cfg.E2BImage, "e2b-image", "", "sbx image for E2B's stock templates (base, code-interpreter-v1) (default: the daemon's default image)")
	f.StringVar(&cfg.PublicURL, "public-url", "", "the daemon's URL as clients see it, for port URLs (default: from each request)")
	f.StringVar(&reqPerTenant, "request-bytes-per-tenant", "256M", "bytes of API requests one tenant (or the single user) may have the daemon reading at once; a request past it gets ResourceExhausted")
	f.StringVar(&reqTotal, "request-bytes-total", "1G", "bytes of API requests the daemon reads at once, all tenants together; a request past it gets ResourceExhausted")
	f.StringVar(&maxLayer, "max-layer-size", "8G", "largest layer the daemon stores: a pulled layer uncompressed, or a snapshot or build step with its files' holes counted (bounds what a sandbox can make appear on the host whatever its --disk)")
	f.StringVar(&boxLimits, "box-kernel-limits", "", "what all of one sandbox's processes together may hold of the kernel's per-user counters, as name=value,... over the defaults "+
		idmap.DefaultLimits().String()+" (values above the host's are lowered to them)")
	f.Uint64Var(&cfg.BoxesCPUShares, "boxes-cpu-shares", daemon.DefaultBoxesCPUShares, "CPU weight of all sandboxes of each runtime (oci, gvisor) together against each host process, the daemon's threads included (cgroup cpu.shares, 1024 = one process; cpu.weight shares*100/1024 on cgroup v2): low, so the daemon and exec requests get the CPU at once while sandboxes are busy; an idle host's CPU still goes to sandboxes")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// checkLimits refuses per-sandbox limits that would mean none.
func checkLimits(cfg daemon.Config) error {
	l := cfg.NetLimits
	for _, f := range []struct {
		flag string
		v    int64
	}{
		{"--dns-qps", int64(l.DNSQueriesPerSec)}, {"--dns-inflight", int64(l.DNSInFlight)},
		{"--dns-tcp-conns", int64(l.DNSTCPConns)}, {"--dns-tcp-idle-timeout", int64(l.DNSTCPIdleTimeout)},
		{"--egress-max-conns", int64(l.EgressConns)}, {"--egress-idle-timeout", int64(l.EgressIdleTimeout)},
		{"--proxy-max-conns", int64(cfg.ProxyMaxConns)},
		{"--exec-max-streams", int64(cfg.StreamLimits.ExecsPerSandbox)}, {"--file-max-streams", int64(cfg.StreamLimits.FilesPerSandbox)},
		{"--exec-max-background", int64(cfg.StreamLimits.BackgroundPerSandbox)}, {"--exec-relay-rate", cfg.StreamLimits.RelayBytesPerSecond},
	} {
		if f.v <= 0 {
			return fmt.Errorf("%s must be positive (a per-sandbox limit; there is no unlimited)", f.flag)
		}
	}
	switch {
	case cfg.StreamLimits.FilesPerSandbox > agentconn.MaxStalledStreams:
		return fmt.Errorf("--file-max-streams %d: at most %d (each file call may hold a flow-control window of the sandbox's agent connection)",
			cfg.StreamLimits.FilesPerSandbox, agentconn.MaxStalledStreams)
	case cfg.StatsInterval != 0 && (cfg.StatsInterval < 100*time.Millisecond || cfg.StatsInterval > time.Minute):
		return fmt.Errorf("--stats-interval %s: want 100ms to 1m", cfg.StatsInterval)
	case cfg.StreamLimits.BackgroundPerSandbox > server.MaxBackgroundPerSandbox:
		return fmt.Errorf("--exec-max-background %d: at most %d (the sandbox agent's own bound)", cfg.StreamLimits.BackgroundPerSandbox, server.MaxBackgroundPerSandbox)
	case cfg.StateCreatingGrace <= 0 || cfg.StateTeardownGrace <= 0:
		return fmt.Errorf("--state-creating-grace %s, --state-teardown-grace %s: want positive durations", cfg.StateCreatingGrace, cfg.StateTeardownGrace)
	case cfg.WarmPool < 0 || cfg.WarmPoolMax < 0:
		return fmt.Errorf("--warm-pool %d, --warm-pool-max %d: want counts of sandboxes, 0 or more", cfg.WarmPool, cfg.WarmPoolMax)
	case cfg.WarmPoolMax > 0 && cfg.WarmPoolMax < cfg.WarmPool:
		return fmt.Errorf("--warm-pool-max %d is below --warm-pool %d: the pool never holds fewer than --warm-pool", cfg.WarmPoolMax, cfg.WarmPool)
	}
	return nil
}

// readAuthToken reads the daemon's token from file, else $SBX_AUTH_TOKEN.
func readAuthToken(file string) (string, error) {
	tok, from := strings.TrimSpace(os.Getenv("SBX_AUTH_TOKEN")), "SBX_AUTH_TOKEN"
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("reading the auth token: %w", err)
		}
		tok, from = strings.TrimSpace(string(b)), file
		if tok == "" {
			return "", fmt.Errorf("auth token file %s is empty", file)
		}
	}
	if tok != "" && len(tok) < 16 {
		return "", fmt.Errorf("the auth token in %s is shorter than 16 characters: use a long random one (e.g. openssl rand -hex 32)", from)
	}
	return tok, nil
}

// reloadOnHUP re-reads the tenants file on every SIGHUP until ctx ends; a
// file that does not parse leaves the tenants in force and is logged.
func reloadOnHUP(ctx context.Context, reg *tenant.Registry, path string, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := reg.Reload(); err != nil {
				log.Error("reloading the tenants file; the old tenants stay in force", "file", path, "err", err)
				continue
			}
			log.Info("tenants file reloaded", "file", path)
		}
	}
}
