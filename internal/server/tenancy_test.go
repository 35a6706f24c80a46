package server

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/builder"
	"github.com/sbxdev/sbx/internal/codebase"
	"github.com/sbxdev/sbx/internal/codeexec"
	"github.com/sbxdev/sbx/internal/events"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/metrics"
	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/fake"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/store"
	"github.com/sbxdev/sbx/internal/tenant"
	"github.com/sbxdev/sbx/internal/testutil"
	"github.com/sbxdev/sbx/internal/volume"
)

// registeredProcedures lists every RPC of the sbx.v1 services, from the
// compiled descriptors: a new RPC shows up here without anyone adding it.
func registeredProcedures(t *testing.T) []string {
	t.Helper()
	var out []string
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if fd.Package() != "sbx.v1" {
			return true
		}
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			for j := 0; j < sd.Methods().Len(); j++ {
				out = append(out, "/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()))
			}
		}
		return true
	})
	if len(out) < 40 {
		t.Fatalf("found %d sbx.v1 RPCs in the descriptors, want the whole API (are the generated files linked?)", len(out))
	}
	slices.Sort(out)
	return out
}

func TestEveryRPCHasATenancyRule(t *testing.T) {
	for _, p := range registeredProcedures(t) {
		if _, ok := rpcAccess[p]; !ok {
			t.Errorf("%s has no entry in rpcAccess: decide how tenants and scoped tokens see it", p)
		}
		if _, ok := tenancyCases[p]; !ok {
			t.Errorf("%s has no case in tenancyCases: TestTenancyEveryRPC must cover it", p)
		}
	}
}

// tenancyEnv is a front in tenant mode over the fake driver (real agents)
// with tenants "acme" and "beta".
type tenancyEnv struct {
	mgr           *sandbox.Manager
	srv           *httptest.Server
	dash          *httptest.Server // the dashboard's listener (Front.Dashboard)
	tokA, tokB    string
	boxA, boxA2   string // acme's sandboxes
	sessA, ctxA   string // a session and a code context in boxA
	parent        string // acme's sandbox with a scoped token
	child         string // parent's child
	scoped        string // parent's scoped token
	discardLogger *slog.Logger
	stores        *TenantStores
	registry      *tenant.Registry
	admin         string // the admin token
	sampler       *metrics.Sampler
}

// importImage imports a small random image into c's tenant's store as ref.
func importImage(ctx context.Context, c rpcClients, ref string) error {
	return importImageSized(ctx, c, ref, 1024)
}

func importImageSized(ctx context.Context, c rpcClients, ref string, size int64) error {
	img, err := random.Image(size, 1)
	if err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		return err
	}
	st := c.img.ImportImage(ctx)
	if err := st.Send(&sbxv1.ImportImageRequest{Msg: &sbxv1.ImportImageRequest_Header{Header: &sbxv1.ImportImageHeader{Tag: ref}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := st.Send(&sbxv1.ImportImageRequest{Msg: &sbxv1.ImportImageRequest_Data{Data: buf.Bytes()}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = st.CloseAndReceive()
	return err
}

const tenantsJSON = `{"tenants": [
	{"name": "acme", "tokens": [%q], "quotas": {"max_sandboxes": 8}},
	{"name": "beta", "tokens": [%q], "quotas": {"max_sandboxes": 2, "memory_bytes": 201326592, "cpu_millis": 1500, "disk_bytes": 50331648, "storage_bytes": 12582912}}
], "admin_tokens": [%q]}`

func newTenancyEnv(t *testing.T) *tenancyEnv {
	t.Helper()
	dir := t.TempDir()
	// The fake driver's "boxes" are host processes: run_code writes its
	// runner under codeexec.RunDir on the host itself.
	if _, err := os.Stat(codeexec.RunDir); errors.Is(err, os.ErrNotExist) {
		t.Cleanup(func() { os.RemoveAll(codeexec.RunDir) })
	}
	ctx := context.Background()
	st, err := store.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	drv, err := fake.New(fake.Config{StateDir: filepath.Join(dir, "fake"), AgentPath: testutil.AgentBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	imgCfg := image.Config{Dir: filepath.Join(dir, "images"), UIDShift: 100000, Logger: log}
	images, err := image.Open(ctx, imgCfg)
	if err != nil {
		t.Fatal(err)
	}
	vols, err := volume.Open(ctx, filepath.Join(dir, "volumes"), 100000, log)
	if err != nil {
		t.Fatal(err)
	}
	stores := NewTenantStores(dir, imgCfg, images, vols, log)
	cbs, err := codebase.Open(ctx, codebase.Config{Dir: filepath.Join(dir, "codebases"), Store: st, UIDShift: 100000, Logger: log, Storage: stores})
	if err != nil {
		t.Fatal(err)
	}
	stores.SetCodebases(cbs)
	bus := events.New(events.Config{})
	mgr, err := sandbox.New(sandbox.Config{
		Events: bus,
		Store:  st, Codebases: cbs, Drivers: map[string]runtime.Driver{"fake": drv}, DefaultRuntime: "fake",
		Defaults: runtime.Resources{MemoryBytes: 64 << 20, CPUMillis: 500, Pids: 64, DiskBytes: 16 << 20},
		Limits: sandbox.Limits{
			MinMemoryBytes: 16 << 20, MaxMemoryBytes: 8 << 30, MinCPUMillis: 10, MaxCPUMillis: 2000,
			MinPids: 16, MaxPids: 1 << 20, MinDiskBytes: 1 << 20, MaxDiskBytes: 1 << 40, MaxTimeoutMs: 3600_000,
		},
		Logger:     log,
		BoxAPIAddr: "127.0.0.1:1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	mgr.Run()
	e := &tenancyEnv{mgr: mgr, tokA: tenant.NewToken(), tokB: tenant.NewToken(), admin: tenant.NewToken(), discardLogger: log}
	set, err := tenant.Parse(fmt.Appendf(nil, tenantsJSON, tenant.HashToken(e.tokA), tenant.HashToken(e.tokB), tenant.HashToken(e.admin)))
	if err != nil {
		t.Fatal(err)
	}
	api := New(mgr)
	code := codeexec.New(mgr, log)
	sessions := codeexec.NewSessions(mgr, log)
	api.AddCode(NewCodeServer(code, mgr))
	api.AddSessions(NewSessionServer(sessions, mgr))
	stores.SetManager(mgr)
	e.stores = stores
	var gc sync.RWMutex
	imgSrv := NewImageServer(stores, &gc)
	bld, err := builder.New(builder.Config{Manager: mgr, Stores: stores, Storage: stores.CheckStorage, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	imgSrv.SetBuilder(bld)
	api.AddImages(imgSrv)
	e.registry = tenant.NewRegistry(set)
	api.AddTenants(NewTenantServer(mgr, stores, e.registry))
	e.sampler = metrics.NewSampler(mgr, metrics.SamplerConfig{})
	obs := &Observer{Mgr: mgr, Bus: bus, Sampler: e.sampler, Metrics: metrics.New(metrics.Config{Sampler: e.sampler, Events: bus})}
	api.AddObserve(obs)
	mux := WithCodebases(WithVolumes(api.Handler(), NewVolumeServer(stores)), NewCodebaseServer(cbs, mgr))
	front := NewFront(mux, mgr, FrontConfig{Tenants: e.registry, ScopedTokens: true, ProxyDomain: "sbx.test", Logger: log, Observer: obs})
	e.dash = httptest.NewServer(front.Dashboard(http.NotFoundHandler()))
	t.Cleanup(e.dash.Close)
	e.srv = httptest.NewUnstartedServer(front)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	e.srv.Config.Protocols = &protos
	e.srv.Start()
	t.Cleanup(func() {
		front.Close()
		e.srv.Close()
		code.Shutdown()
		sessions.Shutdown()
		for _, p := range []tenant.Principal{{Tenant: "acme"}, {Tenant: "beta"}, {}} {
			pctx := tenant.WithPrincipal(ctx, p)
			list, _ := mgr.List(pctx, nil)
			for _, sb := range list {
				_ = mgr.Destroy(pctx, sb.Id)
			}
			// Volumes are loop mounts: remove them all.
			if v, err := stores.Volumes(pctx); err == nil {
				vs, _ := v.List(pctx)
				for _, vol := range vs {
					if err := v.Remove(pctx, vol.GetName()); err != nil {
						t.Errorf("cleanup: removing volume %s of %q: %v", vol.GetName(), p.Tenant, err)
					}
				}
			}
		}
		stores.Close()
		images.Close()
		mgr.Close()
		st.Close()
	})

	a := e.clients(e.tokA)
	mk := func(c rpcClients, req *sbxv1.CreateSandboxRequest) string {
		t.Helper()
		resp, err := c.sb.CreateSandbox(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("create %v: %v", req, err)
		}
		return resp.Msg.GetSandbox().GetId()
	}
	// Its command (which exits at once) is what Logs and Wait read.
	e.boxA = mk(a, &sbxv1.CreateSandboxRequest{Name: "dev", Command: []string{"echo", "hi"}})
	e.boxA2 = mk(a, &sbxv1.CreateSandboxRequest{})
	ss, err := a.sess.CreateSession(ctx, connect.NewRequest(&sbxv1.CreateSessionRequest{Sandbox: "dev", Shell: "/bin/sh"}))
	if err != nil {
		t.Fatalf("create acme's session: %v", err)
	}
	e.sessA = ss.Msg.GetSession().GetId()
	cc, err := a.code.CreateContext(ctx, connect.NewRequest(&sbxv1.CreateContextRequest{Sandbox: e.boxA, Language: "python"}))
	if err != nil {
		t.Fatalf("create acme's code context: %v", err)
	}
	e.ctxA = cc.Msg.GetContext().GetId()
	e.parent = mk(a, &sbxv1.CreateSandboxRequest{ScopedToken: true})
	out, err := e.exec(a, e.parent, "printenv SBX_TOKEN")
	if err != nil || !strings.HasPrefix(out, "sbx_") {
		t.Fatalf("SBX_TOKEN in the scoped box: got %q, %v; want a token", out, err)
	}
	e.scoped = strings.TrimSpace(out)
	e.child = mk(e.clients(e.scoped), &sbxv1.CreateSandboxRequest{Command: []string{"echo", "hi"}})
	if _, err := a.vol.CreateVolume(ctx, connect.NewRequest(&sbxv1.CreateVolumeRequest{Name: "data", SizeBytes: 8 << 20})); err != nil {
		t.Fatalf("acme's volume: %v", err)
	}
	if err := importImage(ctx, a, "app:1"); err != nil {
		t.Fatalf("acme's image: %v", err)
	}
	if err := createCodebase(ctx, a, "src", tarOf("secret.txt", "acme's code")); err != nil {
		t.Fatalf("acme's codebase: %v", err)
	}
	e.sampler.SampleOnce(ctx)
	return e
}

// createCodebase uploads tree (a tar) as c's tenant's codebase name.
func createCodebase(ctx context.Context, c rpcClients, name string, tree []byte) error {
	st := c.cb.CreateCodebase(ctx)
	if err := st.Send(&sbxv1.CreateCodebaseRequest{Msg: &sbxv1.CreateCodebaseRequest_Header{Header: &sbxv1.CreateCodebaseHeader{Name: name}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := st.Send(&sbxv1.CreateCodebaseRequest{Msg: &sbxv1.CreateCodebaseRequest_Data{Data: tree}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err := st.CloseAndReceive()
	return err
}

// rpcClients are clients of every service, all sending one token.
type rpcClients struct {
	sb    sbxv1connect.SandboxServiceClient
	img   sbxv1connect.ImageServiceClient
	vol   sbxv1connect.VolumeServiceClient
	cb    sbxv1connect.CodebaseServiceClient
	port  sbxv1connect.PortServiceClient
	sess  sbxv1connect.SessionServiceClient
	code  sbxv1connect.CodeServiceClient
	ten   sbxv1connect.TenantServiceClient
	obs   sbxv1connect.ObserveServiceClient
	proc  sbxv1connect.ProcessServiceClient
	token string
}

// h2c speaks cleartext HTTP/2, as the SDKs do (bidi streams need it).
var h2c = func() *http.Transport {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Transport{Protocols: &protos}
}()

type tokenTransport struct{ tok string }

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if t.tok != "" {
		r.Header.Set("Authorization", "Bearer "+t.tok)
	}
	return h2c.RoundTrip(r)
}

func (e *tenancyEnv) clients(tok string) rpcClients {
	hc := &http.Client{Transport: tokenTransport{tok}}
	u := e.srv.URL
	return rpcClients{
		sb: sbxv1connect.NewSandboxServiceClient(hc, u), img: sbxv1connect.NewImageServiceClient(hc, u),
		vol: sbxv1connect.NewVolumeServiceClient(hc, u), cb: sbxv1connect.NewCodebaseServiceClient(hc, u),
		port: sbxv1connect.NewPortServiceClient(hc, u), sess: sbxv1connect.NewSessionServiceClient(hc, u),
		code: sbxv1connect.NewCodeServiceClient(hc, u), ten: sbxv1connect.NewTenantServiceClient(hc, u), token: tok,
		obs: sbxv1connect.NewObserveServiceClient(hc, u), proc: sbxv1connect.NewProcessServiceClient(hc, u),
	}
}

// exec runs a shell command in sandbox ref and returns its stdout.
func (e *tenancyEnv) exec(c rpcClients, ref, cmd string) (string, error) {
	st, err := c.sb.Exec(context.Background(), connect.NewRequest(&sbxv1.ExecRequest{Sandbox: ref, Shell: cmd}))
	if err != nil {
		return "", err
	}
	defer st.Close()
	var out bytes.Buffer
	for st.Receive() {
		out.Write(st.Msg().GetStdout())
	}
	return out.String(), st.Err()
}

// drain reads a server stream to its end.
func drain[T any](st *connect.ServerStreamForClient[T], err error) error {
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
	}
	return st.Err()
}

func tarOf(name, body string) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body))})
	_, _ = tw.Write([]byte(body))
	_ = tw.Close()
	return b.Bytes()
}

// target says what a case's ref names.
type target int

const (
	targetSandbox target = iota // a sandbox id or name
	targetSession
	targetContext
	targetNone   // names nothing (Version)
	targetList   // lists: call returns the ids it saw
	targetTenant // the caller's tenant's images, volumes or codebases: refused to scoped tokens
	// targetTenantSandbox names a sandbox and works on its tenant's
	// stores (snapshot, codebase sync): refused to scoped tokens.
	targetTenantSandbox
	targetSelf  // the caller's own tenant (GetTenant)
	targetAdmin // every tenant: the admin token's alone
	// targetObserve lists what the caller may observe (call returns the
	// sandbox ids seen, and "image:REF" for image events): a tenant its
	// own, a scoped token its children, the admin token every tenant's.
	targetObserve
)

type tenancyCase struct {
	target target
	// call makes the RPC about ref; for targetList it returns the ids seen.
	call func(ctx context.Context, c rpcClients, ref string) ([]string, error)
}

func one(err error) ([]string, error) { return nil, err }

// tenancyScratch is the test's temp dir (set by TestTenancyEveryRPC), under
// which tmp makes paths: the fake driver shares the host's file system
// between boxes, and what the cases write must go with the test.
var tenancyScratch = os.TempDir()

// tmp is a per-sandbox scratch path.
func tmp(ref, name string) string { return filepath.Join(tenancyScratch, "sbx-tenancy-"+ref+"-"+name) }

// withProcess starts a background process in sandbox ref and calls f on
// it; when the start fails (another tenant's sandbox, a missing one) it
// calls f on a made-up process, so that f's own answer is what is checked.
func withProcess(ctx context.Context, c rpcClients, ref string, f func(proc string) error) ([]string, error) {
	resp, err := c.proc.StartProcess(ctx, connect.NewRequest(&sbxv1.StartProcessRequest{Exec: &sbxv1.ExecRequest{Sandbox: ref, Argv: []string{"sleep", "60"}}}))
	if err != nil {
		return nil, f("proc-00000000000000ff")
	}
	id := resp.Msg.GetProcess().GetId()
	defer c.proc.RemoveProcess(ctx, connect.NewRequest(&sbxv1.RemoveProcessRequest{Sandbox: ref, Process: id})) //nolint:errcheck
	return nil, f(id)
}

var tenancyCases = map[string]tenancyCase{
	sbxv1connect.ObserveServiceEventsProcedure: {targetObserve, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		st, err := c.obs.Events(ctx, connect.NewRequest(&sbxv1.EventsRequest{SinceMs: 1, NoFollow: true}))
		if err != nil {
			return nil, err
		}
		defer st.Close()
		var ids []string
		for st.Receive() {
			ev := st.Msg().GetEvent()
			switch {
			case ev.GetSandboxId() != "":
				ids = append(ids, ev.GetSandboxId())
			case ev.GetType() == sbxv1.EventType_EVENT_TYPE_IMAGE_PULLED:
				ids = append(ids, "image:"+ev.GetDetail())
			}
		}
		return ids, st.Err()
	}},
	sbxv1connect.ObserveServiceStatsProcedure: {targetObserve, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.obs.Stats(ctx, connect.NewRequest(&sbxv1.StatsRequest{History: true}))
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, e := range resp.Msg.GetSandboxes() {
			ids = append(ids, e.GetSandboxId())
		}
		return ids, nil
	}},
	sbxv1connect.ProcessServiceStartProcessProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		resp, err := c.proc.StartProcess(ctx, connect.NewRequest(&sbxv1.StartProcessRequest{Exec: &sbxv1.ExecRequest{Sandbox: ref, Argv: []string{"true"}}}))
		if err != nil {
			return nil, err
		}
		return one2(c.proc.RemoveProcess(ctx, connect.NewRequest(&sbxv1.RemoveProcessRequest{Sandbox: ref, Process: resp.Msg.GetProcess().GetId()})))
	}},
	sbxv1connect.ProcessServiceListProcessesProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.proc.ListProcesses(ctx, connect.NewRequest(&sbxv1.ListProcessesRequest{Sandbox: ref})))
	}},
	sbxv1connect.ProcessServiceGetProcessProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return withProcess(ctx, c, ref, func(id string) error {
			_, err := c.proc.GetProcess(ctx, connect.NewRequest(&sbxv1.GetProcessRequest{Sandbox: ref, Process: id}))
			return err
		})
	}},
	sbxv1connect.ProcessServiceConnectProcessProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return withProcess(ctx, c, ref, func(id string) error {
			return drain(c.proc.ConnectProcess(ctx, connect.NewRequest(&sbxv1.ConnectProcessRequest{Sandbox: ref, Process: id})))
		})
	}},
	sbxv1connect.ProcessServiceSendProcessInputProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return withProcess(ctx, c, ref, func(id string) error {
			_, err := c.proc.SendProcessInput(ctx, connect.NewRequest(&sbxv1.SendProcessInputRequest{Sandbox: ref, Process: id, StdinClose: true}))
			return err
		})
	}},
	sbxv1connect.ProcessServiceSignalProcessProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return withProcess(ctx, c, ref, func(id string) error {
			_, err := c.proc.SignalProcess(ctx, connect.NewRequest(&sbxv1.SignalProcessRequest{Sandbox: ref, Process: id}))
			return err
		})
	}},
	sbxv1connect.ProcessServiceWaitProcessProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return withProcess(ctx, c, ref, func(id string) error {
			_, _ = c.proc.SignalProcess(ctx, connect.NewRequest(&sbxv1.SignalProcessRequest{Sandbox: ref, Process: id}))
			_, err := c.proc.WaitProcess(ctx, connect.NewRequest(&sbxv1.WaitProcessRequest{Sandbox: ref, Process: id}))
			return err
		})
	}},
	sbxv1connect.ProcessServiceRemoveProcessProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return withProcess(ctx, c, ref, func(id string) error {
			_, err := c.proc.RemoveProcess(ctx, connect.NewRequest(&sbxv1.RemoveProcessRequest{Sandbox: ref, Process: id}))
			return err
		})
	}},
	sbxv1connect.SandboxServiceVersionProcedure: {targetNone, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		return one2(c.sb.Version(ctx, connect.NewRequest(&sbxv1.VersionRequest{})))
	}},
	sbxv1connect.SandboxServiceCreateSandboxProcedure: {targetList, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		// Names are per tenant: each tenant may have its own "shared".
		resp, err := c.sb.CreateSandbox(ctx, connect.NewRequest(&sbxv1.CreateSandboxRequest{Name: "shared"}))
		if err != nil {
			return nil, err
		}
		_, err = c.sb.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: resp.Msg.GetSandbox().GetId()}))
		return nil, err
	}},
	sbxv1connect.SandboxServiceListSandboxesProcedure: {targetList, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.sb.ListSandboxes(ctx, connect.NewRequest(&sbxv1.ListSandboxesRequest{}))
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, s := range resp.Msg.GetSandboxes() {
			ids = append(ids, s.GetId())
		}
		return ids, nil
	}},
	sbxv1connect.SandboxServiceGetSandboxProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.GetSandbox(ctx, connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: ref})))
	}},
	sbxv1connect.SandboxServiceStopSandboxProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		if _, err := c.sb.StopSandbox(ctx, connect.NewRequest(&sbxv1.StopSandboxRequest{Sandbox: ref})); err != nil {
			return nil, err
		}
		return one2(c.sb.StartSandbox(ctx, connect.NewRequest(&sbxv1.StartSandboxRequest{Sandbox: ref})))
	}},
	sbxv1connect.SandboxServiceStartSandboxProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.StartSandbox(ctx, connect.NewRequest(&sbxv1.StartSandboxRequest{Sandbox: ref})))
	}},
	sbxv1connect.SandboxServiceDestroySandboxProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Run last on a sandbox made for it (see the test).
		return one2(c.sb.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: ref})))
	}},
	sbxv1connect.SandboxServiceUpdateNetworkProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.UpdateNetwork(ctx, connect.NewRequest(&sbxv1.UpdateNetworkRequest{Sandbox: ref, Network: &sbxv1.NetworkPolicy{}})))
	}},
	sbxv1connect.SandboxServiceUpdateSandboxProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.UpdateSandbox(ctx, connect.NewRequest(&sbxv1.UpdateSandboxRequest{Sandbox: ref, SetLabels: map[string]string{"touched": "yes"}})))
	}},
	sbxv1connect.SandboxServiceSnapshotSandboxProcedure: {targetTenantSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.SnapshotSandbox(ctx, connect.NewRequest(&sbxv1.SnapshotSandboxRequest{Sandbox: ref, Tag: "x:1"})))
	}},
	sbxv1connect.SandboxServiceExecProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.sb.Exec(ctx, connect.NewRequest(&sbxv1.ExecRequest{Sandbox: ref, Argv: []string{"true"}}))))
	}},
	sbxv1connect.SandboxServiceExecInteractiveProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		st := c.sb.ExecInteractive(ctx)
		if err := st.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Sandbox: ref, Argv: []string{"true"}}}}); err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		_ = st.CloseRequest()
		for {
			if _, err := st.Receive(); err != nil {
				_ = st.CloseResponse()
				if errors.Is(err, io.EOF) {
					return nil, nil
				}
				return nil, err
			}
		}
	}},
	sbxv1connect.SandboxServiceWriteFileProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		st := c.sb.WriteFile(ctx)
		_ = st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: &sbxv1.WriteFileHeader{Sandbox: ref, Path: tmp(ref, "w")}}})
		_ = st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: []byte("hi")}})
		return one2(st.CloseAndReceive())
	}},
	sbxv1connect.SandboxServiceLogsProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.sb.Logs(ctx, connect.NewRequest(&sbxv1.LogsRequest{Sandbox: ref, Follow: true}))))
	}},
	sbxv1connect.SandboxServiceWaitProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.Wait(ctx, connect.NewRequest(&sbxv1.WaitRequest{Sandbox: ref})))
	}},
	sbxv1connect.SandboxServiceReadFileProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.sb.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Sandbox: ref, Path: "/etc/hostname"}))))
	}},
	sbxv1connect.SandboxServiceListDirProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Sandbox: ref, Path: "/etc"})))
	}},
	sbxv1connect.SandboxServiceStatProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Sandbox: ref, Path: "/etc"})))
	}},
	sbxv1connect.SandboxServiceMakeDirProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.sb.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Sandbox: ref, Path: tmp(ref, "d"), Parents: true})))
	}},
	sbxv1connect.SandboxServiceRenameProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		if _, err := c.sb.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Sandbox: ref, Path: tmp(ref, "r1"), Parents: true})); err != nil {
			return nil, err
		}
		return one2(c.sb.Rename(ctx, connect.NewRequest(&sbxv1.RenameRequest{Sandbox: ref, From: tmp(ref, "r1"), To: tmp(ref, "r2")})))
	}},
	sbxv1connect.SandboxServiceRemoveProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		if _, err := c.sb.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Sandbox: ref, Path: tmp(ref, "x"), Parents: true})); err != nil {
			return nil, err
		}
		return one2(c.sb.Remove(ctx, connect.NewRequest(&sbxv1.RemoveRequest{Sandbox: ref, Path: tmp(ref, "x"), Recursive: true})))
	}},
	sbxv1connect.SandboxServiceUploadTarProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		st := c.sb.UploadTar(ctx)
		_ = st.Send(&sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Header{Header: &sbxv1.UploadTarHeader{Sandbox: ref, Path: tmp(ref, "u")}}})
		_ = st.Send(&sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Data{Data: tarOf("f", "x")}})
		return one2(st.CloseAndReceive())
	}},
	sbxv1connect.SandboxServiceDownloadTarProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.sb.DownloadTar(ctx, connect.NewRequest(&sbxv1.DownloadTarRequest{Sandbox: ref, Path: "/etc/hostname"}))))
	}},
	sbxv1connect.PortServiceGetPortProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.port.GetPort(ctx, connect.NewRequest(&sbxv1.GetPortRequest{Sandbox: ref, Port: 8080})))
	}},
	sbxv1connect.PortServiceListPortsProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.port.ListPorts(ctx, connect.NewRequest(&sbxv1.ListPortsRequest{Sandbox: ref})))
	}},
	sbxv1connect.SessionServiceCreateSessionProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		resp, err := c.sess.CreateSession(ctx, connect.NewRequest(&sbxv1.CreateSessionRequest{Sandbox: ref, Shell: "/bin/sh"}))
		if err != nil {
			return nil, err
		}
		return one2(c.sess.CloseSession(ctx, connect.NewRequest(&sbxv1.CloseSessionRequest{Session: resp.Msg.GetSession().GetId()})))
	}},
	sbxv1connect.SessionServiceSessionExecProcedure: {targetSession, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.sess.SessionExec(ctx, connect.NewRequest(&sbxv1.SessionExecRequest{Session: ref, Command: "true"}))))
	}},
	sbxv1connect.SessionServiceListSessionsProcedure: {targetList, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.sess.ListSessions(ctx, connect.NewRequest(&sbxv1.ListSessionsRequest{}))
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, s := range resp.Msg.GetSessions() {
			ids = append(ids, s.GetId(), s.GetSandbox())
		}
		return ids, nil
	}},
	sbxv1connect.SessionServiceCloseSessionProcedure: {targetSession, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Run last (see the test).
		return one2(c.sess.CloseSession(ctx, connect.NewRequest(&sbxv1.CloseSessionRequest{Session: ref})))
	}},
	sbxv1connect.CodeServiceRunCodeProcedure: {targetContext, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.code.RunCode(ctx, connect.NewRequest(&sbxv1.RunCodeRequest{Context: ref, Code: "1+1"}))))
	}},
	sbxv1connect.CodeServiceCreateContextProcedure: {targetSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		resp, err := c.code.CreateContext(ctx, connect.NewRequest(&sbxv1.CreateContextRequest{Sandbox: ref, Language: "python"}))
		if err != nil {
			return nil, err
		}
		return one2(c.code.CloseContext(ctx, connect.NewRequest(&sbxv1.CloseContextRequest{Context: resp.Msg.GetContext().GetId()})))
	}},
	sbxv1connect.CodeServiceListContextsProcedure: {targetList, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.code.ListContexts(ctx, connect.NewRequest(&sbxv1.ListContextsRequest{}))
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, s := range resp.Msg.GetContexts() {
			ids = append(ids, s.GetId(), s.GetSandbox())
		}
		return ids, nil
	}},
	sbxv1connect.CodeServiceCloseContextProcedure: {targetContext, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Run last (see the test).
		return one2(c.code.CloseContext(ctx, connect.NewRequest(&sbxv1.CloseContextRequest{Context: ref})))
	}},
	sbxv1connect.CodebaseServiceSyncCodebaseProcedure: {targetTenantSandbox, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.cb.SyncCodebase(ctx, connect.NewRequest(&sbxv1.SyncCodebaseRequest{Sandbox: ref})))
	}},
	sbxv1connect.CodebaseServiceCreateCodebaseProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Names are per tenant: every tenant may make its own.
		if err := createCodebase(ctx, c, ref+"-new", tarOf("f", "x")); err != nil {
			return nil, err
		}
		return one2(c.cb.DeleteCodebase(ctx, connect.NewRequest(&sbxv1.DeleteCodebaseRequest{Codebase: ref + "-new"})))
	}},
	sbxv1connect.CodebaseServiceListCodebasesProcedure: {targetTenant, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.cb.ListCodebases(ctx, connect.NewRequest(&sbxv1.ListCodebasesRequest{}))
		if err != nil {
			return nil, err
		}
		var names []string
		for _, cb := range resp.Msg.GetCodebases() {
			names = append(names, cb.GetName())
		}
		return names, nil
	}},
	sbxv1connect.CodebaseServiceGetCodebaseProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.cb.GetCodebase(ctx, connect.NewRequest(&sbxv1.GetCodebaseRequest{Codebase: ref})))
	}},
	sbxv1connect.CodebaseServiceDownloadCodebaseProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.cb.DownloadCodebase(ctx, connect.NewRequest(&sbxv1.DownloadCodebaseRequest{Codebase: ref}))))
	}},
	sbxv1connect.CodebaseServiceDeleteCodebaseProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Run last (see the test).
		return one2(c.cb.DeleteCodebase(ctx, connect.NewRequest(&sbxv1.DeleteCodebaseRequest{Codebase: ref})))
	}},
	sbxv1connect.TenantServiceGetTenantProcedure: {targetSelf, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		resp, err := c.ten.GetTenant(ctx, connect.NewRequest(&sbxv1.GetTenantRequest{Name: ref}))
		if err != nil {
			return nil, err
		}
		return []string{resp.Msg.GetTenant().GetName()}, nil
	}},
	sbxv1connect.TenantServiceListTenantsProcedure: {targetAdmin, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.ten.ListTenants(ctx, connect.NewRequest(&sbxv1.ListTenantsRequest{}))
		if err != nil {
			return nil, err
		}
		var names []string
		for _, t := range resp.Msg.GetTenants() {
			names = append(names, t.GetName())
		}
		return names, nil
	}},
	sbxv1connect.ImageServicePullImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		// Nothing listens there: the pull reaches the tenant's store and fails.
		err := drain(c.img.PullImage(ctx, connect.NewRequest(&sbxv1.PullImageRequest{Ref: "127.0.0.1:1/x:1"})))
		if connect.CodeOf(err) == connect.CodeUnavailable || connect.CodeOf(err) == connect.CodeInternal {
			err = nil
		}
		return nil, err
	}},
	sbxv1connect.ImageServiceImportImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Names are per tenant: every tenant may import its own ref.
		return nil, importImage(ctx, c, ref+"-imported")
	}},
	sbxv1connect.ImageServiceExportImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one(drain(c.img.ExportImage(ctx, connect.NewRequest(&sbxv1.ExportImageRequest{Ref: ref}))))
	}},
	sbxv1connect.ImageServiceListImagesProcedure: {targetTenant, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.img.ListImages(ctx, connect.NewRequest(&sbxv1.ListImagesRequest{}))
		if err != nil {
			return nil, err
		}
		var refs []string
		for _, i := range resp.Msg.GetImages() {
			refs = append(refs, i.GetRef())
		}
		return refs, nil
	}},
	sbxv1connect.ImageServiceGetImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.img.GetImage(ctx, connect.NewRequest(&sbxv1.GetImageRequest{Ref: ref})))
	}},
	sbxv1connect.ImageServiceTagImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.img.TagImage(ctx, connect.NewRequest(&sbxv1.TagImageRequest{Source: ref, Target: ref + "-tagged"})))
	}},
	sbxv1connect.ImageServiceRemoveImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Run last (see the test).
		return one2(c.img.RemoveImage(ctx, connect.NewRequest(&sbxv1.RemoveImageRequest{Ref: ref})))
	}},
	sbxv1connect.ImageServicePruneImagesProcedure: {targetTenant, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		return one2(c.img.PruneImages(ctx, connect.NewRequest(&sbxv1.PruneImagesRequest{})))
	}},
	sbxv1connect.ImageServiceBuildImageProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// A config-only recipe on ref: it resolves ref in the caller's
		// tenant's store and runs no sandbox.
		recipe := &sbxv1.Recipe{From: ref, Steps: []*sbxv1.RecipeStep{{Step: &sbxv1.RecipeStep_Env{Env: &sbxv1.EnvStep{Env: map[string]string{"BUILT": "1"}}}}}}
		return one(drain(c.img.BuildImage(ctx, connect.NewRequest(&sbxv1.BuildImageRequest{Recipe: recipe, Tag: "built:1"}))))
	}},
	sbxv1connect.VolumeServiceCreateVolumeProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Names are per tenant: every tenant may have its own "scratch".
		if _, err := c.vol.CreateVolume(ctx, connect.NewRequest(&sbxv1.CreateVolumeRequest{Name: "scratch", SizeBytes: 8 << 20})); err != nil {
			return nil, err
		}
		return one2(c.vol.RemoveVolume(ctx, connect.NewRequest(&sbxv1.RemoveVolumeRequest{Name: "scratch"})))
	}},
	sbxv1connect.VolumeServiceListVolumesProcedure: {targetTenant, func(ctx context.Context, c rpcClients, _ string) ([]string, error) {
		resp, err := c.vol.ListVolumes(ctx, connect.NewRequest(&sbxv1.ListVolumesRequest{}))
		if err != nil {
			return nil, err
		}
		var names []string
		for _, v := range resp.Msg.GetVolumes() {
			names = append(names, v.GetName())
		}
		return names, nil
	}},
	sbxv1connect.VolumeServiceGetVolumeProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		return one2(c.vol.GetVolume(ctx, connect.NewRequest(&sbxv1.GetVolumeRequest{Name: ref})))
	}},
	sbxv1connect.VolumeServiceRemoveVolumeProcedure: {targetTenant, func(ctx context.Context, c rpcClients, ref string) ([]string, error) {
		// Run last (see the test).
		return one2(c.vol.RemoveVolume(ctx, connect.NewRequest(&sbxv1.RemoveVolumeRequest{Name: ref})))
	}},
}

func one2[T any](_ T, err error) ([]string, error) { return nil, err }

// ownCode is what the owner gets where that is not success.
var ownCode = map[string]connect.Code{
	// The test daemon runs without networking.
	sbxv1connect.SandboxServiceUpdateNetworkProcedure: connect.CodeFailedPrecondition,
	// The fake driver cannot snapshot; the box mounts no codebase.
	sbxv1connect.SandboxServiceSnapshotSandboxProcedure: connect.CodeFailedPrecondition,
	sbxv1connect.CodebaseServiceSyncCodebaseProcedure:   connect.CodeFailedPrecondition,
}

// runLast are the cases that end what they name.
var runLast = []string{
	sbxv1connect.CodebaseServiceDeleteCodebaseProcedure,
	sbxv1connect.ImageServiceRemoveImageProcedure,
	sbxv1connect.VolumeServiceRemoveVolumeProcedure,
	sbxv1connect.SandboxServiceDestroySandboxProcedure,
	sbxv1connect.SessionServiceCloseSessionProcedure,
	sbxv1connect.CodeServiceCloseContextProcedure,
}

// TestTenancyEveryRPC calls every RPC of the API (from the descriptors)
// with acme's token (works), beta's (NotFound, word for word what a
// missing object gets), none (Unauthenticated), the scoped token of one
// of acme's sandboxes (only its children) and the admin token (the tenant
// service only).
func TestTenancyEveryRPC(t *testing.T) {
	tenancyScratch = t.TempDir()
	e := newTenancyEnv(t)
	ctx := context.Background()
	a, b, none, scoped, admin := e.clients(e.tokA), e.clients(e.tokB), e.clients(""), e.clients(e.scoped), e.clients(e.admin)
	procs := registeredProcedures(t)
	procs = slices.DeleteFunc(procs, func(p string) bool { return slices.Contains(runLast, p) })
	procs = append(procs, runLast...)
	acmeObjects := []string{e.boxA, e.boxA2, e.parent, e.child, e.sessA, e.ctxA}
	missing := map[target]string{targetSandbox: "sb-0000000000ff", targetTenantSandbox: "sb-0000000000ff", targetSession: "sess-00000000000000ff", targetContext: "ctx-00000000000000ff"}
	own := map[target]string{targetSandbox: e.boxA, targetTenantSandbox: e.boxA, targetSession: e.sessA, targetContext: e.ctxA}

	// sameAsMissing checks that c's call on ref fails exactly like its call
	// on a missing object of the same kind.
	sameAsMissing := func(t *testing.T, tc tenancyCase, c rpcClients, who, ref string) {
		t.Helper()
		_, errMissing := tc.call(ctx, c, missing[tc.target])
		_, err := tc.call(ctx, c, ref)
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("%s on acme's %s: got %v, want NotFound", who, ref, err)
		}
		var ce, cm *connect.Error
		if !errors.As(err, &ce) || !errors.As(errMissing, &cm) {
			t.Fatalf("%s: errors %v and %v are not Connect errors", who, err, errMissing)
		}
		if want := strings.ReplaceAll(cm.Message(), missing[tc.target], ref); ce.Message() != want {
			t.Errorf("%s on acme's %s: got %q, want %q (what a missing one gets): it tells an existing object from a missing one", who, ref, ce.Message(), want)
		}
	}

	for _, p := range procs {
		tc := tenancyCases[p]
		t.Run(strings.TrimPrefix(p, "/sbx.v1."), func(t *testing.T) {
			if _, err := tc.call(ctx, none, own[tc.target]); connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("without a token: got %v, want Unauthenticated", err)
			}
			// The admin token is no tenant (and never the owner ""): it
			// reaches nothing but the tenant service and Version.
			if tc.target != targetNone && tc.target != targetSelf && tc.target != targetAdmin && tc.target != targetObserve {
				ref := own[tc.target]
				if ref == "" {
					ref = "app:1"
				}
				if _, err := tc.call(ctx, admin, ref); connect.CodeOf(err) != connect.CodePermissionDenied {
					t.Errorf("admin token: got %v, want PermissionDenied", err)
				}
			}
			switch tc.target {
			case targetNone:
				for _, c := range []rpcClients{a, b, scoped} {
					if _, err := tc.call(ctx, c, ""); err != nil {
						t.Errorf("with a token: got %v, want success", err)
					}
				}
			case targetSelf:
				for who, c := range map[string]rpcClients{"acme": a, "beta": b, "scoped": scoped} {
					want := map[string]string{"acme": "acme", "beta": "beta", "scoped": "acme"}[who]
					if got, err := tc.call(ctx, c, ""); err != nil || len(got) != 1 || got[0] != want {
						t.Errorf("%s on itself: got %v, %v; want %s", who, got, err, want)
					}
				}
				// Naming another tenant is answered like naming none that exists.
				_, errMissing := tc.call(ctx, b, "nope")
				_, err := tc.call(ctx, b, "acme")
				var ce, cm *connect.Error
				if connect.CodeOf(err) != connect.CodeNotFound || !errors.As(err, &ce) || !errors.As(errMissing, &cm) ||
					ce.Message() != strings.ReplaceAll(cm.Message(), "nope", "acme") {
					t.Errorf("beta naming acme: got %v, want %v with the name replaced", err, errMissing)
				}
				if got, err := tc.call(ctx, admin, "beta"); err != nil || len(got) != 1 || got[0] != "beta" {
					t.Errorf("admin naming beta: got %v, %v; want beta", got, err)
				}
			case targetAdmin:
				for who, c := range map[string]rpcClients{"acme": a, "beta": b, "scoped": scoped} {
					if _, err := tc.call(ctx, c, ""); connect.CodeOf(err) != connect.CodePermissionDenied {
						t.Errorf("%s: got %v, want PermissionDenied (admin token only)", who, err)
					}
				}
				if got, err := tc.call(ctx, admin, ""); err != nil || !slices.Equal(got, []string{"acme", "beta"}) {
					t.Errorf("admin: got %v, %v; want [acme beta]", got, err)
				}
			case targetTenantSandbox:
				if _, err := tc.call(ctx, scoped, e.child); connect.CodeOf(err) != connect.CodePermissionDenied {
					t.Errorf("scoped token on its child: got %v, want PermissionDenied (it manages child sandboxes only)", err)
				}
				sameAsMissing(t, tc, b, "beta", e.boxA)
				if _, err := tc.call(ctx, a, e.boxA); err != nil && connect.CodeOf(err) != ownCode[p] {
					t.Errorf("acme on its own %s: got %v, want success", e.boxA, err)
				}
			case targetTenant:
				ref, missingRef := "app:1", "nope:1"
				switch {
				case strings.Contains(p, "VolumeService"):
					ref, missingRef = "data", "nope"
				case strings.Contains(p, "CodebaseService"):
					ref, missingRef = "src", "nope"
				}
				if _, err := tc.call(ctx, scoped, ref); connect.CodeOf(err) != connect.CodePermissionDenied {
					t.Errorf("scoped token: got %v, want PermissionDenied (it manages child sandboxes only)", err)
				}
				switch p {
				case sbxv1connect.ImageServiceListImagesProcedure, sbxv1connect.VolumeServiceListVolumesProcedure,
					sbxv1connect.CodebaseServiceListCodebasesProcedure:
					named := func(g string) bool { return g == ref || strings.HasSuffix(g, "/"+ref) }
					if got, err := tc.call(ctx, a, ""); err != nil || !slices.ContainsFunc(got, named) {
						t.Errorf("acme's list: got %v, %v; want %s in it", got, err, ref)
					}
					if got, err := tc.call(ctx, b, ""); err != nil || slices.ContainsFunc(got, named) {
						t.Errorf("beta's list: got %v, %v; want acme's %s not in it", got, err, ref)
					}
				case sbxv1connect.ImageServiceGetImageProcedure, sbxv1connect.ImageServiceExportImageProcedure,
					sbxv1connect.ImageServiceTagImageProcedure, sbxv1connect.ImageServiceRemoveImageProcedure,
					sbxv1connect.VolumeServiceGetVolumeProcedure, sbxv1connect.VolumeServiceRemoveVolumeProcedure,
					sbxv1connect.CodebaseServiceGetCodebaseProcedure, sbxv1connect.CodebaseServiceDownloadCodebaseProcedure,
					sbxv1connect.CodebaseServiceDeleteCodebaseProcedure, sbxv1connect.ImageServiceBuildImageProcedure:
					_, errMissing := tc.call(ctx, b, missingRef)
					_, err := tc.call(ctx, b, ref)
					var ce, cm *connect.Error
					if connect.CodeOf(err) != connect.CodeNotFound || !errors.As(err, &ce) || !errors.As(errMissing, &cm) ||
						ce.Message() != strings.ReplaceAll(cm.Message(), missingRef, ref) {
						t.Errorf("beta on acme's %s: got %v, want %v with the name replaced", ref, err, errMissing)
					}
				default:
					if _, err := tc.call(ctx, b, ref); err != nil {
						t.Errorf("beta in its own store: got %v, want success", err)
					}
				}
				if _, err := tc.call(ctx, a, ref); err != nil {
					t.Errorf("acme on its own %s: got %v, want success", ref, err)
				}
			case targetObserve:
				mine, err := tc.call(ctx, a, "")
				if err != nil || !slices.Contains(mine, e.boxA) {
					t.Fatalf("acme: got %v, %v; want its %s among them", mine, err, e.boxA)
				}
				all, err := tc.call(ctx, admin, "")
				if err != nil || !slices.Contains(all, e.boxA) {
					t.Errorf("admin: got %v, %v; want acme's %s among them (the admin token observes every tenant)", all, err, e.boxA)
				}
				ids, err := tc.call(ctx, b, "")
				if err != nil {
					t.Fatalf("beta: got %v, want success", err)
				}
				for _, id := range append(acmeObjects, "image:app:1") {
					if slices.Contains(ids, id) {
						t.Errorf("beta sees acme's %s", id)
					}
				}
				ids, err = tc.call(ctx, scoped, "")
				if err != nil {
					t.Fatalf("scoped: got %v, want success", err)
				}
				for _, id := range ids {
					if id != e.child {
						t.Errorf("the scoped token sees %s, which is not its child", id)
					}
				}
			case targetList:
				if _, err := tc.call(ctx, a, ""); err != nil {
					t.Fatalf("acme: got %v, want success", err)
				}
				ids, err := tc.call(ctx, b, "")
				if err != nil {
					t.Fatalf("beta: got %v, want success", err)
				}
				for _, id := range acmeObjects {
					if slices.Contains(ids, id) {
						t.Errorf("beta sees acme's %s", id)
					}
				}
				ids, err = tc.call(ctx, scoped, "")
				if err != nil {
					t.Fatalf("scoped: got %v, want success", err)
				}
				for _, id := range []string{e.boxA, e.boxA2, e.parent, e.sessA, e.ctxA} {
					if slices.Contains(ids, id) {
						t.Errorf("the scoped token sees %s, which is not its child", id)
					}
				}
			default:
				ref := own[tc.target]
				sameAsMissing(t, tc, b, "beta", ref)
				sameAsMissing(t, tc, scoped, "scoped", ref)
				if tc.target == targetSandbox {
					// A scoped token sees its parent's siblings no more than its parent.
					sameAsMissing(t, tc, scoped, "scoped", e.parent)
					// ... and works on its own children.
					if _, err := tc.call(ctx, scoped, e.child); err != nil && connect.CodeOf(err) != ownCode[p] {
						t.Errorf("scoped on its child: got %v, want success", err)
					}
				}
				if p == sbxv1connect.SandboxServiceDestroySandboxProcedure {
					// Beta's attempts left acme's sandbox alone.
					if _, err := a.sb.GetSandbox(ctx, connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: ref})); err != nil {
						t.Fatalf("acme's sandbox after beta's destroy: %v", err)
					}
					resp, err := a.sb.CreateSandbox(ctx, connect.NewRequest(&sbxv1.CreateSandboxRequest{}))
					if err != nil {
						t.Fatal(err)
					}
					ref = resp.Msg.GetSandbox().GetId()
				}
				if _, err := tc.call(ctx, a, ref); err != nil && connect.CodeOf(err) != ownCode[p] {
					t.Errorf("acme on its own %s: got %v, want success", ref, err)
				}
			}
		})
	}
}
