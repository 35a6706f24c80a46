package integration

import (
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// countingRegistry is a loopback registry that counts manifest GETs per
// repository path.
type countingRegistry struct {
	host string
	mu   sync.Mutex
	gets map[string]int
}

func startCountingRegistry(t *testing.T) *countingRegistry {
	t.Helper()
	cr := &countingRegistry{gets: map[string]int{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			if repo, _, ok := strings.Cut(r.URL.Path, "/manifests/"); ok {
				cr.mu.Lock()
				cr.gets[strings.TrimPrefix(repo, "/v2/")]++
				cr.mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cr.host = strings.TrimPrefix(srv.URL, "http://")
	return cr
}

func (cr *countingRegistry) manifestGets(repo string) int {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	return cr.gets[repo]
}

// push puts the tiny test image at host/repo:tag and returns its ref.
func (cr *countingRegistry) push(t *testing.T, repoTag string) string {
	t.Helper()
	ref := cr.host + "/" + repoTag
	pushImage(t, ref, tinyImage(t))
	return ref
}

// pushImage writes img to a loopback registry as ref.
func pushImage(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func codeOf(err error) connect.Code {
	var se *sbx.Error
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

// TestCreateAutoPulls: creating a sandbox from an image the daemon does
// not have pulls it from the (loopback) registry into the caller's
// tenant's store: concurrent creates fetch its manifest once; another
// tenant does not see it; a tenant whose storage quota it exceeds gets
// ResourceExhausted and keeps nothing; bad references fail naming them;
// the CLI shows the pull's progress.
func TestCreateAutoPulls(t *testing.T) {
	d, a, b, _ := tenantDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	reg := startCountingRegistry(t)
	ref := reg.push(t, "auto/tiny:1")

	const creates = 4
	var wg sync.WaitGroup
	boxes := make([]*sbx.Sandbox, creates)
	errs := make([]error, creates)
	for i := range creates {
		wg.Go(func() { boxes[i], errs[i] = a.Create(ctx, sbx.CreateOptions{Image: ref}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("create %d of a missing image: %v", i, err)
		}
		d.remember(boxes[i].ID)
	}
	if got := reg.manifestGets("auto/tiny"); got != 1 {
		t.Errorf("%d concurrent creates fetched the manifest %d times; want 1", creates, got)
	}
	for _, sb := range boxes {
		if got := mustRun(t, ctx, sb, "cat /etc/motd"); got != "top\n" {
			t.Errorf("in the auto-pulled image: got %q, want %q", got, "top\n")
		}
	}
	if img, err := a.Images().Get(ctx, ref); err != nil || img.GetDigest() != boxes[0].Info.GetImageDigest() {
		t.Errorf("acme's store after the create: %v, %v; want the image its boxes run", img, err)
	}
	// A later create uses the stored image: no second pull.
	sb, err := a.Create(ctx, sbx.CreateOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	if got := reg.manifestGets("auto/tiny"); got != 1 {
		t.Errorf("a create of a stored image fetched its manifest again (%d GETs)", got)
	}

	// Beta has its own store: acme's pull is not beta's image, and beta's
	// 1 MiB storage quota cannot hold it.
	if _, err := b.Images().Get(ctx, ref); !sbx.IsNotFound(err) {
		t.Errorf("beta's store has acme's pulled image: %v", err)
	}
	_, err = b.Create(ctx, sbx.CreateOptions{Image: ref})
	if codeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "storage") {
		t.Errorf("beta's create over its storage quota: got %v, want ResourceExhausted naming the storage quota", err)
	}
	if _, err := b.Images().Get(ctx, ref); !sbx.IsNotFound(err) {
		t.Errorf("beta keeps the image that took it over its quota: %v", err)
	}

	// Bad references name themselves.
	for _, tc := range []struct {
		ref  string
		code connect.Code
	}{
		{"Not A Ref!", connect.CodeInvalidArgument},
		{reg.host + "/auto/missing:1", connect.CodeNotFound},
	} {
		_, err := a.Create(ctx, sbx.CreateOptions{Image: tc.ref})
		if codeOf(err) != tc.code || !strings.Contains(err.Error(), tc.ref) {
			t.Errorf("create from %q: got %v, want %v naming the reference", tc.ref, err, tc.code)
		}
	}

	// The CLI pulls first, showing progress, then creates.
	ref2 := reg.push(t, "auto/cli:1")
	out, errOut, code := d.cli("", "create", "--image", ref2)
	if code != 0 {
		t.Fatalf("sbx create --image %s: exit %d: %s", ref2, code, errOut)
	}
	d.remember(strings.TrimSpace(out))
	// (Its layers are the first image's: they are reported as stored.)
	if !strings.Contains(errOut, "pulling "+ref2) || !strings.Contains(errOut, " exists ") {
		t.Errorf("sbx create of a missing image: stderr %q; want the pull's progress", errOut)
	}
	if got := reg.manifestGets("auto/cli"); got != 1 {
		t.Errorf("sbx create fetched the manifest %d times; want 1", got)
	}
}
