package integration

import (
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestTenantPullsReachNoInternalAddress: a tenant's pull (PullImage, a
// create's auto-pull, a build's FROM) makes the daemon connect where the
// tenant says, which made it a way into the host's and its network's
// internal services (an internal HTTP service here, cloud metadata at
// 169.254.169.254 in real life): the registry host itself, a registry's
// redirect, and the token realm a registry names were all fetched, and the
// answer's body came back in the pull's error. Now a tenant's pulls connect
// only to public addresses and those the operator allows
// (--tenant-pull-allow; here 127.0.0.2 plays the internet's registry),
// checked on the address actually dialled, so no name, redirect or realm
// gets around it.
func TestTenantPullsReachNoInternalAddress(t *testing.T) {
	const secret = "internal-service-secret-7d1f"
	var hits atomic.Int64
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(secret))
	}))
	t.Cleanup(internal.Close)
	internalHost := strings.TrimPrefix(internal.URL, "http://")
	_, internalPort, _ := net.SplitHostPort(internalHost)

	// The tenant's own registries, on allowed addresses: one points the
	// daemon at the internal service by redirect, the other by the token
	// realm it names.
	evilRegistry := func(addr string, h http.HandlerFunc) string {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(h)
		srv.Listener.Close()
		srv.Listener = ln
		srv.Start()
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	redirecting := evilRegistry("127.0.0.2:0", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		http.Redirect(w, r, internal.URL+"/latest/meta-data/", http.StatusFound)
	})
	realm := evilRegistry("127.0.0.3:0", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="`+internal.URL+`/latest/meta-data/",service="x"`)
		w.WriteHeader(http.StatusUnauthorized)
	})

	_, a, _, _ := tenantDaemonArgs(t, "--tenant-pull-allow", "127.0.0.2/31")
	ctx := ctxT(t, 2*time.Minute)
	for _, tc := range []struct {
		name, ref string
		direct    bool // the refusal is the daemon's own, naming the address
	}{
		{"loopback registry", internalHost + "/x:1", true},
		{"localhost by name", "localhost:" + internalPort + "/x:1", true},
		{"redirect", redirecting + "/x:1", false},
		{"token realm", realm + "/x:1", false},
	} {
		before := hits.Load()
		_, err := a.Images().Pull(ctx, tc.ref, nil)
		if got := hits.Load() - before; got != 0 {
			t.Errorf("%s: pulling %s made the daemon send %d requests to an internal service", tc.name, tc.ref, got)
		}
		if err == nil || strings.Contains(err.Error(), secret) {
			t.Errorf("%s: pull %s: got %v, want an error without the internal service's answer", tc.name, tc.ref, err)
		}
		if tc.direct && err != nil && (codeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "not a public address")) {
			t.Errorf("%s: pull %s: got %v, want PermissionDenied saying the address is not a public one", tc.name, tc.ref, err)
		}
		// A create's auto-pull goes the same way.
		if _, err := a.Create(ctx, sbx.CreateOptions{Image: tc.ref}); err == nil {
			t.Errorf("%s: create from %s: got a sandbox", tc.name, tc.ref)
		}
		if got := hits.Load() - before; got != 0 {
			t.Errorf("%s: creating from %s made the daemon send %d requests to an internal service", tc.name, tc.ref, got)
		}
	}
}

// TestTenantPullsUseNoOperatorLogin: the daemon pulled with its docker
// config (the host user's `docker login`s, the operator's) for everyone, so
// any tenant could pull an image only the operator's login may read. Now a
// tenant's pull is anonymous (here: 401 from the registry, PermissionDenied)
// unless the operator shares the logins with --tenant-pull-credentials.
func TestTenantPullsUseNoOperatorLogin(t *testing.T) {
	const user, pass = "operator", "s3cret-operator-pass"
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var authed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="private"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if strings.Contains(r.URL.Path, "/manifests/") && r.Method == http.MethodGet {
			authed.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/private/img:1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, tinyImage(t), remote.WithAuth(&authn.Basic{Username: user, Password: pass})); err != nil {
		t.Fatal(err)
	}
	// The operator's login, where the daemon's docker config is.
	cfgDir := t.TempDir()
	cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, host, cred), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", cfgDir)
	ctx := ctxT(t, 2*time.Minute)

	_, a, _, _ := tenantDaemon(t)
	_, err = a.Images().Pull(ctx, ref, nil)
	if codeOf(err) != connect.CodePermissionDenied {
		t.Errorf("tenant pulling an image only the operator's login reads: got %v, want PermissionDenied", err)
	}
	if _, err := a.Create(ctx, sbx.CreateOptions{Image: ref}); err == nil {
		t.Errorf("tenant creating from an image only the operator's login reads: got a sandbox")
	}
	if got := authed.Load(); got != 0 {
		t.Errorf("the daemon sent the operator's login on a tenant's behalf (%d manifest GETs with it)", got)
	}

	_, shared, _, _ := tenantDaemonArgs(t, "--tenant-pull-allow", "127.0.0.1/32", "--tenant-pull-credentials")
	if _, err := shared.Images().Pull(ctx, ref, nil); err != nil {
		t.Errorf("with --tenant-pull-credentials: %v, want the pull to use the operator's login", err)
	}
}
