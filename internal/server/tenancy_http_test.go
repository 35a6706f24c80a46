package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestTenancyHTTPRoutes: every way to a sandbox port (path, raw TCP,
// sbx and E2B headers, host name), the exec upgrade and the raw file route
// answer another tenant's token exactly as they answer for a missing
// sandbox, and work for the owner; without a token they say Unauthorized.
func TestTenancyHTTPRoutes(t *testing.T) {
	e := newTenancyEnv(t)
	// The fake driver shares the host's network: a server here is on
	// every box's loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "app") })) //nolint:errcheck // ends with ln
	port := ln.Addr().(*net.TCPAddr).Port
	const missing = "sb-0000000000ff"

	type req struct {
		name string
		make func(box string) *http.Request
	}
	get := func(path string) *http.Request {
		r, _ := http.NewRequest("GET", e.srv.URL+path, nil)
		return r
	}
	routes := []req{
		{"path", func(box string) *http.Request { return get(fmt.Sprintf("/proxy/%s/%d/", box, port)) }},
		{"sbx headers", func(box string) *http.Request {
			r := get("/")
			r.Header.Set(HeaderSandbox, box)
			r.Header.Set(HeaderPort, fmt.Sprint(port))
			return r
		}},
		{"e2b headers", func(box string) *http.Request {
			r := get("/")
			r.Header.Set(HeaderE2BSandboxID, box)
			r.Header.Set(HeaderE2BSandboxPort, fmt.Sprint(port))
			return r
		}},
		{"host name", func(box string) *http.Request {
			r := get("/")
			r.Host = fmt.Sprintf("%d-%s.sbx.test", port, box)
			return r
		}},
	}
	do := func(r *http.Request, tok string) (int, string) {
		t.Helper()
		if tok != "" {
			r.Header.Set(HeaderToken, tok)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			if code, body := do(rt.make(e.boxA), e.tokA); code != 200 || body != "app" {
				t.Errorf("acme to its own port: got %d %q, want 200 \"app\"", code, body)
			}
			if code, _ := do(rt.make(e.boxA), ""); code != http.StatusUnauthorized {
				t.Errorf("no token: got %d, want 401", code)
			}
			// The admin token is no proxy credential (and never the owner "").
			if code, _ := do(rt.make(e.boxA), e.admin); code != http.StatusUnauthorized {
				t.Errorf("admin token: got %d, want 401", code)
			}
			for who, tok := range map[string]string{"beta": e.tokB, "scoped": e.scoped} {
				mc, mb := do(rt.make(missing), tok)
				code, body := do(rt.make(e.boxA), tok)
				if code != http.StatusNotFound || code != mc || body != strings.ReplaceAll(mb, missing, e.boxA) {
					t.Errorf("%s to acme's port: got %d %q, want %d %q (as for a missing sandbox)", who, code, body, mc, strings.ReplaceAll(mb, missing, e.boxA))
				}
			}
			if code, body := do(rt.make(e.child), e.scoped); code != 200 || body != "app" {
				t.Errorf("scoped token to its child's port: got %d %q, want 200 \"app\"", code, body)
			}
		})
	}

	t.Run("raw tcp", func(t *testing.T) {
		dial := func(box, tok string) string {
			c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "GET /tcp/%s/%d HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\nX-Sbx-Token: %s\r\n\r\n", box, port, TCPUpgrade, tok)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode == http.StatusSwitchingProtocols {
				return "101"
			}
			return fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		if got := dial(e.boxA, e.tokA); got != "101" {
			t.Errorf("acme: got %q, want 101", got)
		}
		for who, tok := range map[string]string{"beta": e.tokB, "scoped": e.scoped} {
			want := strings.ReplaceAll(dial(missing, tok), missing, e.boxA)
			if got := dial(e.boxA, tok); got != want || !strings.HasPrefix(got, "404") {
				t.Errorf("%s: got %q, want %q (a 404 as for a missing sandbox)", who, got, want)
			}
		}
	})

	t.Run("raw file route", func(t *testing.T) {
		// PUT and GET of FilesPath act as the caller's Principal, like
		// WriteFile and ReadFile: another tenant's or a scoped token's
		// (not its child) sandbox answers as a missing one, the admin token
		// is refused, and nothing is written.
		call := func(method, box, tok, path string) (int, string) {
			var body io.Reader
			if method == http.MethodPut {
				body = strings.NewReader("raw data")
			}
			r, _ := http.NewRequest(method, e.srv.URL+FilesPath+"?"+url.Values{"sandbox": {box}, "path": {path}}.Encode(), body)
			if tok != "" {
				r.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		path := filepath.Join(t.TempDir(), "raw.txt")
		if code, body := call(http.MethodPut, e.boxA, e.tokA, path); code != http.StatusOK {
			t.Fatalf("acme PUT to its own box: got %d %q, want 200", code, body)
		}
		if code, body := call(http.MethodGet, e.boxA, e.tokA, path); code != http.StatusOK || body != "raw data" {
			t.Fatalf("acme GET from its own box: got %d %q, want 200 \"raw data\"", code, body)
		}
		for _, method := range []string{http.MethodPut, http.MethodGet} {
			for who, tok := range map[string]string{"beta": e.tokB, "scoped": e.scoped} {
				mc, mb := call(method, missing, tok, path+".x")
				code, body := call(method, e.boxA, tok, path+".x")
				if code != http.StatusNotFound || code != mc || body != strings.ReplaceAll(mb, missing, e.boxA) {
					t.Errorf("%s %s on acme's box: got %d %q, want %d %q (as for a missing sandbox)", who, method, code, body, mc, strings.ReplaceAll(mb, missing, e.boxA))
				}
			}
			if code, _ := call(method, e.boxA, e.admin, path+".x"); code != http.StatusForbidden {
				t.Errorf("admin token %s: got %d, want 403", method, code)
			}
			if code, _ := call(method, e.boxA, "", path+".x"); code != http.StatusUnauthorized {
				t.Errorf("no token %s: got %d, want 401", method, code)
			}
		}
		if _, err := os.Stat(path + ".x"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused PUT left %s.x: %v", path, err)
		}
		if code, body := call(http.MethodPut, e.child, e.scoped, path+".child"); code != http.StatusOK {
			t.Errorf("scoped token PUT to its child: got %d %q, want 200", code, body)
		}
	})

	t.Run("exec upgrade", func(t *testing.T) {
		ctx := context.Background()
		run := func(tok, box string) error {
			c := sbx.NewClient(e.srv.URL, sbx.WithToken(tok))
			defer c.Close()
			_, err := c.Sandbox(box).Run(ctx, "true")
			return err
		}
		if err := run(e.tokA, e.boxA); err != nil {
			t.Fatalf("acme: %v", err)
		}
		for who, tok := range map[string]string{"beta": e.tokB, "scoped": e.scoped} {
			errMissing, err := run(tok, missing), run(tok, e.boxA)
			var se, sm *sbx.Error
			if !errors.As(err, &se) || !errors.As(errMissing, &sm) || se.Code != connect.CodeNotFound ||
				se.Msg != strings.ReplaceAll(sm.Msg, missing, e.boxA) {
				t.Errorf("%s exec in acme's box: got %v, want %v with the id replaced", who, err, errMissing)
			}
		}
		if err := run(e.scoped, e.child); err != nil {
			t.Errorf("scoped token in its child: %v", err)
		}
		if err := run(e.admin, e.boxA); err == nil {
			t.Errorf("admin token exec in acme's box: got success, want a refusal")
		}
		if c := (sbx.NewClient(e.srv.URL)); c != nil {
			_, err := c.Sandbox(e.boxA).Run(ctx, "true")
			if connect.CodeOf(errors.Unwrap(err)) != connect.CodeUnauthenticated && !strings.Contains(fmt.Sprint(err), "token") {
				t.Errorf("no token: got %v, want Unauthenticated", err)
			}
			c.Close()
		}
	})
}

// TestTenancyQuotas: each quota's excess is ResourceExhausted naming it,
// and the neighbour is unaffected.
func TestTenancyQuotas(t *testing.T) {
	e := newTenancyEnv(t)
	ctx := context.Background()
	a, b := e.clients(e.tokA), e.clients(e.tokB)
	create := func(c rpcClients, mem, cpu, disk int64) (string, error) {
		resp, err := c.sb.CreateSandbox(ctx, connect.NewRequest(&sbxv1.CreateSandboxRequest{
			Resources: &sbxv1.Resources{MemoryBytes: mem, CpuMillis: cpu, DiskBytes: disk},
		}))
		if err != nil {
			return "", err
		}
		return resp.Msg.GetSandbox().GetId(), nil
	}
	// beta: max_sandboxes 2, memory 192 MiB, cpu 1500m, disk 48 MiB.
	for _, tc := range []struct {
		quota          string
		mem, cpu, disk int64
	}{
		{"memory_bytes", 193 << 20, 100, 1 << 20},
		{"cpu_millis", 64 << 20, 1501, 1 << 20},
		{"disk_bytes", 64 << 20, 100, 49 << 20},
	} {
		_, err := create(b, tc.mem, tc.cpu, tc.disk)
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), tc.quota) {
			t.Errorf("beta over %s: got %v, want ResourceExhausted naming %s", tc.quota, err, tc.quota)
		}
	}
	first, err := create(b, 64<<20, 500, 16<<20)
	if err != nil {
		t.Fatalf("beta's first sandbox: %v", err)
	}
	if _, err := create(b, 64<<20, 500, 16<<20); err != nil {
		t.Fatalf("beta's second sandbox: %v", err)
	}
	if _, err := create(b, 64<<20, 500, 16<<20); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "max_sandboxes") {
		t.Errorf("beta's third sandbox: got %v, want ResourceExhausted naming max_sandboxes", err)
	}
	// The neighbour is unaffected by beta being full.
	if _, err := create(a, 256<<20, 1000, 64<<20); err != nil {
		t.Errorf("acme while beta is at its quota: %v", err)
	}
	// Destroying frees the quota.
	if _, err := b.sb.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: first})); err != nil {
		t.Fatal(err)
	}
	if _, err := create(b, 64<<20, 500, 16<<20); err != nil {
		t.Errorf("beta after destroying one: %v", err)
	}

	// storage_bytes (12 MiB for beta) bounds its volumes and image layers.
	vol := func(c rpcClients, name string) error {
		_, err := c.vol.CreateVolume(ctx, connect.NewRequest(&sbxv1.CreateVolumeRequest{Name: name, SizeBytes: 8 << 20}))
		return err
	}
	if err := vol(b, "v1"); err != nil {
		t.Fatalf("beta's first volume: %v", err)
	}
	if err := vol(b, "v2"); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "storage_bytes") {
		t.Errorf("beta's second 8 MiB volume: got %v, want ResourceExhausted naming storage_bytes", err)
	}
	if err := importImageSized(ctx, b, "big:1", 6<<20); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "storage_bytes") {
		t.Errorf("beta's 6 MiB image past its quota: got %v, want ResourceExhausted naming storage_bytes", err)
	}
	if _, err := b.img.GetImage(ctx, connect.NewRequest(&sbxv1.GetImageRequest{Ref: "big:1"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("the image past the quota after the refusal: got %v, want it removed (NotFound)", err)
	}
	if used, err := e.stores.StorageUsed(tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "beta"})); err != nil || used > 12<<20 {
		t.Errorf("beta's storage after the refused import: %d bytes, %v; want within its 12 MiB quota", used, err)
	}
	// The neighbour is unaffected.
	if err := vol(a, "v2"); err != nil {
		t.Errorf("acme's volume while beta is at its storage quota: %v", err)
	}
	if err := importImageSized(ctx, a, "big:1", 6<<20); err != nil {
		t.Errorf("acme's image while beta is at its storage quota: %v", err)
	}

	// Codebases count too: beta holds its 8 MiB volume; a 5 MiB codebase
	// would take it past 12 MiB.
	bigTree := tarOf("blob", strings.Repeat("x", 5<<20))
	if err := createCodebase(ctx, b, "big", bigTree); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "storage_bytes") {
		t.Errorf("beta's 5 MiB codebase past its quota: got %v, want ResourceExhausted naming storage_bytes", err)
	}
	if resp, err := b.cb.ListCodebases(ctx, connect.NewRequest(&sbxv1.ListCodebasesRequest{})); err != nil || len(resp.Msg.GetCodebases()) != 0 {
		t.Errorf("beta's codebases after the refusal: got %v, %v; want none left behind", resp.Msg.GetCodebases(), err)
	}
	if err := createCodebase(ctx, b, "small", tarOf("f", strings.Repeat("x", 1<<20))); err != nil {
		t.Errorf("beta's 1 MiB codebase within its quota: %v", err)
	}
	// GetTenant reports it all against the quotas.
	resp, err := b.ten.GetTenant(ctx, connect.NewRequest(&sbxv1.GetTenantRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	u, q := resp.Msg.GetTenant().GetUsage(), resp.Msg.GetTenant().GetQuotas()
	if u.GetSandboxes() != 2 || u.GetMemoryBytes() != 128<<20 || u.GetVolumesBytes() != 8<<20 || u.GetCodebasesBytes() != 1<<20 ||
		u.GetStorageBytes() != u.GetImagesBytes()+u.GetVolumesBytes()+u.GetCodebasesBytes() {
		t.Errorf("beta's usage: got %v; want 2 sandboxes, 128 MiB of memory, 8 MiB of volumes, 1 MiB of codebases, storage their sum", u)
	}
	if q.GetStorageBytes() != 12<<20 || q.GetMaxSandboxes() != 2 {
		t.Errorf("beta's quotas: got %v; want storage 12 MiB, 2 sandboxes", q)
	}
	list, err := e.clients(e.admin).ten.ListTenants(ctx, connect.NewRequest(&sbxv1.ListTenantsRequest{}))
	if err != nil || len(list.Msg.GetTenants()) != 2 || list.Msg.GetTenants()[1].GetUsage().GetCodebasesBytes() != 1<<20 {
		t.Errorf("admin's list: got %v, %v; want acme and beta with beta's 1 MiB codebase", list.Msg.GetTenants(), err)
	}
}

// TestTenancyCodebaseMounts: a sandbox mounts only its own tenant's
// codebases; another tenant's is not found, word for word as a missing
// one, and a scoped token mounts none.
func TestTenancyCodebaseMounts(t *testing.T) {
	e := newTenancyEnv(t)
	ctx := context.Background()
	create := func(c rpcClients, cb string) error {
		_, err := c.sb.CreateSandbox(ctx, connect.NewRequest(&sbxv1.CreateSandboxRequest{Codebases: []*sbxv1.CodebaseMount{{Codebase: cb}}}))
		return err
	}
	b := e.clients(e.tokB)
	errMissing, err := create(b, "nope"), create(b, "src")
	var ce, cm *connect.Error
	if connect.CodeOf(err) != connect.CodeNotFound || !errors.As(err, &ce) || !errors.As(errMissing, &cm) ||
		ce.Message() != strings.ReplaceAll(cm.Message(), "nope", "src") {
		t.Errorf("beta mounting acme's src: got %v, want %v with the name replaced", err, errMissing)
	}
	if err := create(e.clients(e.scoped), "src"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("scoped token mounting its tenant's src: got %v, want PermissionDenied", err)
	}
	if err := create(e.clients(e.tokA), "src"); err != nil {
		t.Errorf("acme mounting its own src: %v", err)
	}
}

// TestBoxEndpointAcceptsOnlyScopedTokensFromTheirBox: the front on the
// gateway refuses tenants' tokens, the daemon's token, no token (even on a
// daemon without auth), and a scoped token from any address but its own
// box's (here the fake driver's boxes have none).
func TestBoxEndpointAcceptsOnlyScopedTokensFromTheirBox(t *testing.T) {
	e := newTenancyEnv(t)
	for _, cfg := range []FrontConfig{{BoxEndpoint: true}, {BoxEndpoint: true, Token: execTestToken}} {
		f := NewFront(http.NotFoundHandler(), e.mgr, cfg)
		defer f.Close()
		for who, tok := range map[string]string{"none": "", "acme": e.tokA, "daemon": execTestToken, "scoped from elsewhere": e.scoped} {
			r, _ := http.NewRequest("GET", "/sbx.v1.SandboxService/ListSandboxes", nil)
			r.RemoteAddr = "10.213.0.99:4000"
			if tok != "" {
				r.Header.Set("Authorization", "Bearer "+tok)
			}
			w := httptest.NewRecorder()
			f.ServeHTTP(w, r)
			if w.Code != http.StatusUnauthorized {
				t.Errorf("box endpoint (daemon token %v), %s: got %d, want 401", cfg.Token != "", who, w.Code)
			}
		}
	}
	// The daemon's main listener takes no scoped token: one that leaks out
	// of its box is useless there.
	main := NewFront(http.NotFoundHandler(), e.mgr, FrontConfig{Tenants: e.registry})
	defer main.Close()
	r, _ := http.NewRequest("GET", "/sbx.v1.SandboxService/ListSandboxes", nil)
	r.Header.Set("Authorization", "Bearer "+e.scoped)
	w := httptest.NewRecorder()
	main.ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Errorf("scoped token on the main listener: got %d, want 401", w.Code)
	}
}
