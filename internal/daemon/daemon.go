// Package daemon is sbx's composition root: the one place that builds the
// state store, the runtime drivers, the sandbox manager and the RPC server
// from a Config and serves them until its context ends. Nothing imports it
// but cmd/sbx (through internal/cli) and end-to-end tests.
package daemon

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/codebase"
	"github.com/sbxdev/sbx/internal/codeexec"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/gvisor"
	"github.com/sbxdev/sbx/internal/runtime/oci"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/server"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/ui"
	"github.com/sbxdev/sbx/internal/volume"
)

// Config is everything `sbx serve` can be told.
type Config struct {
	// Listen is the API address, host:port.
	Listen string
	// UIListen is the web dashboard's own address, host:port: an origin
	// that never serves sandbox content (server.Front.Dashboard). "" or
	// "auto": the API listener's host and the port after its own, and no
	// dashboard, with a warning, when that port is taken; "off":
	// no dashboard. An address given explicitly must be free.
	UIListen string
	// DataDir holds the state database and every sandbox's files.
	DataDir string
	// OCIRuntime is the OCI runtime binary ("" = auto: crun where it works, else runc).
	OCIRuntime string
	// AgentPath is the sbx-agent binary ("" = next to this executable).
	AgentPath string
	// RunscPath is gVisor's runsc for the gvisor runtime ("" = runsc on
	// PATH, next to this executable, or in ../.tools/ from it).
	RunscPath string
	// DefaultRuntime names the runtime of sandboxes whose create names none
	// ("" = "oci").
	DefaultRuntime string
	// Kubernetes, when Namespace is set, adds the kubernetes runtime
	// (sandboxes as Pods in that namespace).
	Kubernetes KubernetesConfig
	// State is where sandbox records live: StateSQLite ("" too) or
	// StateKubernetes (replicas sharing them; kubestate.go).
	State string
	// StateNamespace holds the records with StateKubernetes ("" = the
	// kubernetes runtime's namespace).
	StateNamespace string
	// StateCreatingGrace and StateTeardownGrace are how long, with
	// StateKubernetes, a record may stay creating or destroying before
	// another replica finishes it as a dead replica's (0: the manager's
	// defaults, 10m and 2m).
	StateCreatingGrace, StateTeardownGrace time.Duration
	// DefaultTimeout is the lifetime of sandboxes created without one.
	DefaultTimeout time.Duration
	// Defaults are the resources of sandboxes that ask for none.
	Defaults runtime.Resources
	// WarmPool is how many pre-started boxes to keep ready for fast creates
	// at least; WarmPoolMax how many the pool may grow to under bursts of
	// creates (0: sandbox.DefaultWarmPoolMax).
	WarmPool, WarmPoolMax int
	// StatsInterval is how often the sampler reads every sandbox's usage
	// for metrics and `sbx stats` (0: metrics.DefaultInterval).
	StatsInterval time.Duration
	// Network turns sandbox networking on (bridge, firewall, DNS
	// forwarder); off, sandboxes have loopback only.
	Network bool
	// NetBridge, NetSubnet and NetTable name the bridge, its subnet and the
	// nftables table ("" = sbx0, 10.213.0.0/16, sbx).
	NetBridge, NetSubnet, NetTable string
	// DNSUpstreams are the resolvers sandboxes' DNS is forwarded to
	// (host:port; none = the host's /etc/resolv.conf).
	DNSUpstreams []string
	// NetPool is how many network namespaces to keep ready.
	NetPool int
	// EgressPorts are the TCP ports sent through the egress proxy (default
	// 80, 443); EgressRoots extra CA files it trusts upstream.
	EgressPorts []uint16
	EgressRoots []string
	// NetLimits bound each sandbox's use of the DNS forwarder and the
	// egress proxy (zero fields: network.DefaultLimits).
	NetLimits network.Limits
	// ProxyMaxConns bounds the connections one sandbox has open through
	// the port proxy (0: server.DefaultMaxConnsPerSandbox).
	ProxyMaxConns int
	// StreamLimits bound the exec and file calls relayed to one sandbox's
	// agent at once (zero fields: the server's defaults).
	StreamLimits server.StreamLimits
	Logger       *slog.Logger
	// AuthToken, when set, is required on every API and proxied request.
	AuthToken string
	// InsecureNoAuth allows a non-loopback Listen without AuthToken.
	InsecureNoAuth bool
	// Tenants, when set, replaces AuthToken: every request carries one of
	// a tenant's tokens and sees only that tenant's sandboxes.
	Tenants *tenant.Registry
	// TenantPullAllow lists the non-public addresses tenants' pulls may
	// connect to (their registries; by default only public addresses
	// other than the host's: image.PublicOnly).
	TenantPullAllow []netip.Prefix
	// TenantPullCredentials lets tenants' pulls use the daemon's registry
	// credentials (its docker config); otherwise they pull anonymously.
	TenantPullCredentials bool
	// TLSCert and TLSKey, when set, serve the API over TLS (PEM files).
	TLSCert, TLSKey string
	// BoxAPIPort is the port on the network gateway where sandboxes with
	// a scoped token reach the API (0: DefaultBoxAPIPort; needs networking).
	BoxAPIPort uint16
	// RequestBytesPerTenant and RequestBytesTotal bound the bytes of API
	// requests being read at once, for one tenant and in all (0: the
	// defaults, server.DefaultRequestBytesPerTenant and ...Total).
	RequestBytesPerTenant, RequestBytesTotal int64
	// ProxyDomain turns on routing to sandbox ports by host name
	// (<port>-<sandbox-id>.<domain>, for a wildcard DNS name).
	ProxyDomain string
	// NoE2B turns off the E2B-compatible API (internal/e2b).
	NoE2B bool
	// E2BImage is the sbx image of E2B's stock templates ("" = the
	// default image).
	E2BImage string
	// PublicURL is the daemon's URL as clients see it, used in port URLs
	// ("" = taken from each request).
	PublicURL string
	// MaxLayerBytes caps one layer's uncompressed size: a pulled layer's,
	// and a snapshot's or build step's apparent size (its files with their
	// holes), whatever the sandbox's own disk limit (0 =
	// image.DefaultMaxLayerBytes).
	MaxLayerBytes int64
	// BoxLimits bound one sandbox's share of the kernel's per-user counters
	// (nil: idmap.DefaultLimits()).
	BoxLimits idmap.Limits
	// BoxesCPUShares is the CPU weight of all sandboxes together against
	// each host process (0: DefaultBoxesCPUShares).
	BoxesCPUShares uint64
	// Ready, if set, is called with the bound address once serving.
	Ready func(addr string)
}

// DefaultBoxesCPUShares is Config.BoxesCPUShares's default (the oci
// driver's).
const DefaultBoxesCPUShares = oci.DefaultBoxesCPUShares

// DefaultResources are used when Config.Defaults leaves a field zero.
var DefaultResources = runtime.Resources{
	MemoryBytes: 512 << 20,
	CPUMillis:   1000,
	Pids:        512,
	DiskBytes:   1 << 30,
}

// Run serves until ctx is cancelled. Sandboxes outlive the daemon: the next
// Run over the same DataDir re-attaches them.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.DataDir == "" {
		return errors.New("no data dir given")
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	authed := cfg.AuthToken
	if cfg.Tenants != nil {
		authed = "tenants"
	}
	if err := server.CheckListen(cfg.Listen, authed, cfg.InsecureNoAuth); err != nil {
		return err
	}
	if cfg.UIListen != "" && cfg.UIListen != "auto" && cfg.UIListen != "off" {
		if err := server.CheckListen(cfg.UIListen, authed, cfg.InsecureNoAuth); err != nil {
			return fmt.Errorf("--ui-listen: %w", err)
		}
	}
	boxPort := cfg.BoxAPIPort
	if boxPort == 0 {
		boxPort = DefaultBoxAPIPort
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("resolve data dir: %w", err)
	}
	// 0711: sandboxes' user namespaces must be able to traverse to their bundles.
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	unlock, err := lockDataDir(dataDir)
	if err != nil {
		return err
	}
	defer unlock()

	agentPath := cfg.AgentPath
	if agentPath == "" {
		if agentPath, err = findAgent(); err != nil {
			return err
		}
	}
	st, err := store.Open(ctx, dataDir)
	if err != nil {
		return err
	}
	defer st.Close()

	// Listen early: a port in use fails the start before anything is set up.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	uiLn, err := listenUI(cfg.UIListen, ln.Addr(), log)
	if err != nil {
		return err
	}
	if uiLn != nil {
		defer uiLn.Close()
	}

	var netMgr *network.Manager
	if cfg.Network {
		netMgr, err = network.New(ctx, network.Config{
			StateDir: filepath.Join(dataDir, "network"), Bridge: cfg.NetBridge, Subnet: cfg.NetSubnet,
			Table: cfg.NetTable, DNSUpstreams: cfg.DNSUpstreams, PoolSize: cfg.NetPool,
			Logger:      log,
			EgressPorts: cfg.EgressPorts, EgressRoots: cfg.EgressRoots, Limits: cfg.NetLimits, APIPort: boxPort,
		})
		if err != nil {
			return fmt.Errorf("sandbox networking: %w", err)
		}
		defer netMgr.Close()
	}

	ociCfg := ociPlace(dataDir)
	ociCfg.RuntimePath, ociCfg.AgentPath, ociCfg.Network = cfg.OCIRuntime, agentPath, cfg.Network
	ociCfg.BoxLimits, ociCfg.BoxesCPUShares, ociCfg.Logger = cfg.BoxLimits, cfg.BoxesCPUShares, log.With("runtime", "oci")
	drv, err := oci.New(ociCfg)
	if err != nil {
		return fmt.Errorf("oci runtime: %w", err)
	}
	defer drv.Close() // after the manager's deferred Close below has drained the warm pool
	gvCfg := gvisorPlace(dataDir)
	gvCfg.RunscPath, gvCfg.AgentPath, gvCfg.Network = findRunsc(cfg.RunscPath), agentPath, cfg.Network
	gvCfg.BoxesCPUShares, gvCfg.Logger = cfg.BoxesCPUShares, log.With("runtime", "gvisor")
	gv, err := gvisor.New(gvCfg)
	if err != nil {
		return fmt.Errorf("gvisor runtime: %w", err)
	}
	defer gv.Close()
	drivers := map[string]runtime.Driver{drv.Name(): drv, gv.Name(): gv}
	defaults := cfg.Defaults
	fill(&defaults.MemoryBytes, DefaultResources.MemoryBytes)
	fill(&defaults.CPUMillis, DefaultResources.CPUMillis)
	fill(&defaults.Pids, DefaultResources.Pids)
	fill(&defaults.DiskBytes, DefaultResources.DiskBytes)
	// Kubernetes warm pods have the limits the manager gives a create that
	// names none (sandbox.Manager caps the disk as below).
	poolLimits := defaults
	if d, ok := drivers[cmp.Or(cfg.DefaultRuntime, drv.Name())]; ok && d.Info(ctx).Has(runtime.CapDiskInMemory) {
		poolLimits.DiskBytes = min(poolLimits.DiskBytes, sandbox.MaxDiskInMemory(poolLimits.MemoryBytes))
	}
	if err := addKubernetes(ctx, cfg.Kubernetes, poolLimits, drivers, log); err != nil {
		return err
	}
	defaultRuntime := cfg.DefaultRuntime
	if defaultRuntime == "" {
		defaultRuntime = drv.Name()
	}
	def, ok := drivers[defaultRuntime]
	if !ok {
		return fmt.Errorf("--default-runtime %q: no such runtime (have %s)", defaultRuntime, strings.Join(slices.Sorted(maps.Keys(drivers)), ", "))
	}
	for _, d := range drivers {
		info := d.Info(ctx)
		log.Info("runtime driver", "name", info.Name, "healthy", info.Healthy, "detail", info.Detail, "default", info.Name == defaultRuntime)
	}
	if info := def.Info(ctx); !info.Healthy {
		return fmt.Errorf("default runtime %q is unhealthy: %s", defaultRuntime, info.Detail)
	}

	// The stores keep trees in the drivers' stored-id range: asked of the
	// drivers, which must agree (they share the stores).
	infos := make([]runtime.Info, 0, len(drivers))
	for _, d := range drivers {
		infos = append(infos, d.Info(ctx))
	}
	storedIDs, err := runtime.StoredIDsOf(infos...)
	if err != nil {
		return err
	}
	if storedIDs == (idmap.Range{}) {
		return fmt.Errorf("no runtime says how it stores trees' uids (runtime.Info.StoredIDs): %w", errdefs.ErrFailedPrecondition)
	}

	var gcLock sync.RWMutex
	maxLayer := cfg.MaxLayerBytes
	fill(&maxLayer, image.DefaultMaxLayerBytes)
	imgCfg := image.Config{
		Dir:      filepath.Join(dataDir, "images"),
		Logger:   log.With("component", "images"),
		UIDShift: storedIDs.Base,
		IDRange:  storedIDs.Size,
		// Snapshots are capped by the same figure (sandbox.Config below).
		MaxLayerBytes: maxLayer,
	}
	images, err := image.Open(ctx, imgCfg)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer images.Close()

	var sbNet sandbox.Network // stays a nil interface when off
	var boxAPI string
	if netMgr != nil {
		sbNet = netMgr
		boxAPI = net.JoinHostPort(netMgr.Gateway().String(), strconv.Itoa(int(boxPort)))
	}
	vols, err := volume.Open(ctx, filepath.Join(dataDir, "volumes"), storedIDs.Base, log)
	if err != nil {
		return err
	}
	stores := server.NewTenantStores(dataDir, imgCfg, images, vols, log)
	stores.AllowTenantPulls(cfg.TenantPullAllow, cfg.TenantPullCredentials)
	if err := stores.OpenExisting(ctx); err != nil {
		return err
	}
	defer stores.Close()
	cbs, err := codebase.Open(ctx, codebase.Config{
		Dir: filepath.Join(dataDir, "codebases"), Store: st, UIDShift: storedIDs.Base, IDRange: storedIDs.Size,
		Logger: log.With("component", "codebases"), Storage: stores,
	})
	if err != nil {
		return fmt.Errorf("codebase store: %w", err)
	}
	stores.SetCodebases(cbs)
	// Records, sessions and contexts: in the SQLite file, or shared by
	// replicas in the Kubernetes API (then only runtimes every replica
	// reaches are served).
	var records sandbox.Store = st
	var processes codeexec.ProcessStore = st
	switch cfg.State {
	case "", StateSQLite:
	case StateKubernetes:
		kst, shared, err := sharedState(ctx, cfg, drivers, defaultRuntime)
		if err != nil {
			return err
		}
		records, processes, drivers = kst, kst, shared
		log.Info("sandbox state in the Kubernetes API: replicas share it", "runtimes", slices.Sorted(maps.Keys(shared)))
	default:
		return fmt.Errorf("--state %q: want %s or %s: %w", cfg.State, StateSQLite, StateKubernetes, errdefs.ErrInvalidArgument)
	}
	bus := events.New(events.Config{})
	mgr, err := sandbox.New(sandbox.Config{
		Events:         bus,
		Codebases:      cbs,
		Volumes:        stores,
		Network:        sbNet,
		Store:          records,
		Drivers:        drivers,
		DefaultRuntime: defaultRuntime,
		Defaults:       defaults,
		DefaultTimeout: cfg.DefaultTimeout,
		Limits:         hostLimits(),
		Logger:         log,
		WarmPool:       cfg.WarmPool,
		WarmPoolMax:    cfg.WarmPoolMax,
		Images:         imageResolver{stores: stores, gc: &gcLock, puller: server.NewPuller(stores, &gcLock)},
		MaxLayerBytes:  maxLayer,
		BoxAPIAddr:     boxAPI,
		CreatingGrace:  cfg.StateCreatingGrace,
		TeardownGrace:  cfg.StateTeardownGrace,
	})
	if err != nil {
		return err
	}
	if err := mgr.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	defer startK8sPools(drivers, log)() // after mgr.Close
	stores.SetManager(mgr)
	if netMgr != nil {
		netMgr.Start()
	}
	mgr.Run()
	defer mgr.Close()
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving() // before mgr.Close
	obs := observe(octx, mgr, bus, stores, cfg, log)

	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	api := server.New(mgr)
	streams := server.NewStreams(mgr, cfg.StreamLimits, log.With("component", "api"))
	api.UseStreams(streams)
	imageSrv, err := newImageServer(stores, mgr, &gcLock, defaults, log)
	if err != nil {
		return err
	}
	api.AddImages(imageSrv)
	// Sessions and contexts are detached processes in their sandboxes: a
	// restarted daemon re-attaches them from their records, once the
	// sandboxes are recovered. On the way out, detach without stopping them
	// (before mgr.Close drops the agent connections).
	code := codeexec.New(mgr, log)
	code.UseStore(processes)
	code.SetLimit(streams.HoldExec)
	sessions := codeexec.NewSessions(mgr, log)
	sessions.UseStore(processes)
	sessions.SetLimit(streams.HoldExec)
	if err := code.RestoreContexts(ctx); err != nil {
		return err
	}
	if err := sessions.Restore(ctx); err != nil {
		return err
	}
	// With shared state another replica may be starting a session right
	// now (unrecorded until it answers): only a lone daemon reaps.
	if cfg.State != StateKubernetes {
		if err := codeexec.ReapUnrecorded(ctx, mgr, processes, mgr.IDs(), log); err != nil {
			log.Error("removing unrecorded sessions and contexts", "err", err)
		}
	}
	defer code.Shutdown()
	defer sessions.Shutdown()
	api.AddCode(server.NewCodeServer(code, mgr))
	api.AddSessions(server.NewSessionServer(sessions, mgr))
	api.AddTenants(server.NewTenantServer(mgr, stores, cfg.Tenants))
	api.AddObserve(obs)
	handler := server.WithCodebases(server.WithVolumes(api.Handler(), server.NewVolumeServer(stores)), server.NewCodebaseServer(cbs, mgr))
	mcpHandler, err := mcpEndpoint(ln.Addr(), cfg, log)
	if err != nil {
		return err
	}
	fcfg := server.FrontConfig{
		Requests: server.NewRequestBudget(cfg.RequestBytesPerTenant, cfg.RequestBytesTotal),
		Token:    cfg.AuthToken, Tenants: cfg.Tenants, ProxyDomain: cfg.ProxyDomain, PublicURL: cfg.PublicURL, Logger: log.With("component", "proxy"),
		MaxConnsPerSandbox: cfg.ProxyMaxConns, Streams: streams, MCP: mcpHandler, Observer: obs,
	}
	if uiLn != nil {
		fcfg.DashboardPort = uiLn.Addr().(*net.TCPAddr).Port
	}
	if !cfg.NoE2B {
		envdKey, err := server.LoadEnvdKey(dataDir)
		if err != nil {
			return err
		}
		fcfg.EnvdKey = envdKey
		e2bAPI, err := e2bEndpoint(ln.Addr(), cfg, func(id string) string { return server.EnvdToken(envdKey, id) }, log)
		if err != nil {
			return err
		}
		defer e2bAPI.Close()
		fcfg.E2B = e2bAPI
	}
	front := server.NewFront(handler, mgr, fcfg)
	defer front.Close()
	if boxAPI != "" {
		stopBox, err := serveBoxAPI(boxAPI, handler, mgr, streams, obs, fcfg.Requests, cfg, log)
		if err != nil {
			return err
		}
		defer stopBox()
	}
	srv := &http.Server{
		Handler:           front,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(stopObserving) // ends the event streams
	errc := make(chan error, 1)
	var uiSrv *http.Server
	if uiLn != nil {
		uiSrv = &http.Server{
			Handler:           front.Dashboard(ui.Handler()),
			Protocols:         &protos,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		uiSrv.RegisterOnShutdown(stopObserving)
	}
	if cfg.TLSCert != "" {
		protos.SetHTTP2(true)
		go func() { errc <- srv.ServeTLS(ln, cfg.TLSCert, cfg.TLSKey) }()
		if uiSrv != nil {
			go func() { errc <- uiSrv.ServeTLS(uiLn, cfg.TLSCert, cfg.TLSKey) }()
		}
	} else {
		go func() { errc <- srv.Serve(ln) }()
		if uiSrv != nil {
			go func() { errc <- uiSrv.Serve(uiLn) }()
		}
	}
	log.Info("sbx daemon serving", "addr", ln.Addr().String(), "data_dir", dataDir, "auth", cfg.AuthToken != "", "tenants", cfg.Tenants != nil,
		"tls", cfg.TLSCert != "", "box_api", boxAPI, "proxy_domain", cfg.ProxyDomain)
	if uiLn != nil {
		scheme := "http://"
		if cfg.TLSCert != "" {
			scheme = "https://"
		}
		log.Info("web dashboard", "url", scheme+uiLn.Addr().String()+ui.Prefix)
	}
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if uiSrv != nil {
		_ = uiSrv.Shutdown(sctx)
	}
	_ = srv.Shutdown(sctx)
	log.Info("sbx daemon stopped; sandboxes keep running")
	return nil
}

// listenUI opens the dashboard's listener (Config.UIListen); nil: none.
func listenUI(addr string, api net.Addr, log *slog.Logger) (net.Listener, error) {
	if addr == "off" {
		return nil, nil
	}
	if addr != "" && addr != "auto" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s for the web dashboard (--ui-listen): %w", addr, err)
		}
		return ln, nil
	}
	ta, ok := api.(*net.TCPAddr)
	if !ok {
		return nil, nil
	}
	port := 0
	if ta.Port != 0 && ta.Port < 65535 {
		port = ta.Port + 1
	}
	auto := net.JoinHostPort(ta.IP.String(), strconv.Itoa(port))
	ln, err := net.Listen("tcp", auto)
	if err != nil {
		log.Warn("no web dashboard: its default address is taken; give one with --ui-listen", "addr", auto, "err", err)
		return nil, nil
	}
	return ln, nil
}

func fill(v *int64, def int64) {
	if *v == 0 {
		*v = def
	}
}

// hostLimits bounds requests by what this machine has.
func hostLimits() sandbox.Limits {
	mem := totalMemory()
	return sandbox.Limits{
		MinMemoryBytes: 16 << 20, MaxMemoryBytes: mem,
		MinCPUMillis: 10, MaxCPUMillis: int64(goruntime.NumCPU()) * 1000,
		MinPids: 16, MaxPids: maxBoxPids(),
		MinDiskBytes: 1 << 20, MaxDiskBytes: 1 << 40,
		MaxTimeoutMs: (7 * 24 * time.Hour).Milliseconds(),
	}
}

// findAgent looks for sbx-agent next to the running executable.
func findAgent() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("locate own executable: %w", err)
	}
	p := filepath.Join(filepath.Dir(exe), "sbx-agent")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("sbx-agent not found next to %s (build it with `make build` or pass --agent): %w", exe, err)
	}
	return p, nil
}

// lockDataDir makes sure one daemon owns a data dir.
func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "daemon.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s is in use by another sbx daemon: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// imageResolver adapts the image stores to the sandbox manager: a create
// resolves its image in its tenant's store, pulling it first if the store
// does not have it (server.Puller.AutoPull: within the tenant's storage
// quota, once for concurrent creates, never for scoped tokens). Its lock
// keeps garbage collection from running between a create resolving an
// image and the sandbox counting as a user of it.
type imageResolver struct {
	stores *server.TenantStores
	gc     *sync.RWMutex
	puller *server.Puller
}

func (r imageResolver) Resolve(ctx context.Context, ref string) (*sandbox.ResolvedImage, func(), error) {
	store, err := r.stores.Images(ctx)
	if err != nil {
		return nil, nil, err
	}
	r.gc.RLock()
	img, err := store.Get(ctx, ref)
	if errdefs.IsNotFound(err) && r.puller != nil {
		r.gc.RUnlock() // a prune may run while the pull does
		if _, err = r.puller.AutoPull(ctx, ref, err); err != nil {
			return nil, nil, err
		}
		r.gc.RLock()
		img, err = store.Get(ctx, ref)
	}
	if err != nil {
		r.gc.RUnlock()
		return nil, nil, err // the store's error names the image
	}
	c := img.Config
	layers := make([]runtime.Layer, len(img.Layers))
	for i, dir := range img.Layers {
		layers[i] = runtime.Layer{Digest: img.DiffIDs[i], Dir: dir}
	}
	return &sandbox.ResolvedImage{
		Ref: img.Ref, Digest: img.Digest, Layers: layers, Env: c.Env, Workdir: c.WorkingDir,
		User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd, OnHost: c.Labels[sandbox.OnHostLabel] == sandbox.HostImage,
	}, r.gc.RUnlock, nil
}

// ociPlace and gvisorPlace say where the drivers of the daemon over dataDir
// keep their boxes: state dirs under it, and cgroup parents per data dir,
// so that daemons sharing a host (tests, several tenants) never clean up
// each other's boxes.
func ociPlace(dataDir string) oci.Config {
	return oci.Config{StateDir: filepath.Join(dataDir, "oci"), CgroupParent: instanceName("sbx", dataDir)}
}

func gvisorPlace(dataDir string) gvisor.Config {
	return gvisor.Config{StateDir: filepath.Join(dataDir, "gvisor"), CgroupParent: instanceName("sbxgv", dataDir)}
}

// Leftovers lists what is left on the host, per runtime, of the boxes of
// the daemon over dataDir (absolute) whose ids are not in keep, as each
// driver's probe finds it (runtime.Prober): the integration tests' leak
// checker asks here rather than knowing the drivers' layouts. It only
// reads, and works whether or not that daemon runs.
func Leftovers(dataDir string, keep map[string]bool) ([]runtime.Leftover, error) {
	o, err := oci.Leftovers(ociPlace(dataDir), keep)
	if err != nil {
		return nil, fmt.Errorf("oci leftovers: %w", err)
	}
	g, err := gvisor.Leftovers(gvisorPlace(dataDir), keep)
	if err != nil {
		return nil, fmt.Errorf("gvisor leftovers: %w", err)
	}
	return append(o, g...), nil
}

// instanceName names a host-wide resource of the daemon owning dataDir:
// prefix alone for the default data dir, prefix-<hash> for any other.
func instanceName(prefix, dataDir string) string {
	if dataDir == DefaultDataDir {
		return prefix
	}
	sum := sha256.Sum256([]byte(dataDir))
	return fmt.Sprintf("%s-%x", prefix, sum[:4])
}

// findRunsc returns path if set, else runsc on PATH, next to this
// executable or in ../.tools/ from it (a source checkout's bin/sbx, where
// scripts/install-runsc.sh puts it); "" if none: the gvisor runtime is then
// unhealthy and says so.
func findRunsc(path string) string {
	if path != "" {
		return path
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		for _, p := range []string{filepath.Join(dir, "runsc"), filepath.Join(dir, "..", ".tools", "runsc")} {
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
				return p
			}
		}
	}
	return ""
}

// DefaultDataDir is where `sbx serve` keeps its state unless told otherwise.
const DefaultDataDir = "/var/lib/sbx"
