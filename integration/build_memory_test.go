package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// stallRegistry answers /v2/ and holds every manifest request until the
// test ends, counting them: a build whose FROM names it stays under way
// (holding whatever it holds) without any sandbox.
type stallRegistry struct {
	host string
	mu   sync.Mutex
	gets map[string]bool // repositories whose manifest was asked for
}

func startStallRegistry(t *testing.T) *stallRegistry {
	t.Helper()
	sr := &stallRegistry{gets: map[string]bool{}}
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo, _, ok := strings.Cut(r.URL.Path, "/manifests/")
		if !ok {
			w.WriteHeader(http.StatusOK) // GET /v2/
			return
		}
		sr.mu.Lock()
		sr.gets[strings.TrimPrefix(repo, "/v2/")] = true
		sr.mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-done:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) }) // runs first: releases the held requests
	sr.host = strings.TrimPrefix(srv.URL, "http://")
	return sr
}

func (sr *stallRegistry) asked(repo string) bool {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	return sr.gets[repo]
}

// TestBuildsBoundDaemonMemory: a Dockerfile build holds its context and
// the tars of its COPY steps in the daemon's memory until it ends, which a
// hostile client can make last (here: its FROM comes from a registry that
// never answers). Two attacks on the host's memory through that:
//
//   - amplification: a 1 MiB context copied by 250 COPY lines made the
//     daemon hold 250 MiB for one small request (copies were bounded at
//     256 MiB whatever the context); now the copies of a build are bounded
//     by its context's size, and such a Dockerfile is refused;
//   - many builds at once: each held ~3x its request with no bound on how
//     many ran; now the bytes builds hold are charged to a daemon-wide and
//     a per-tenant budget, and a build past them is refused with
//     ResourceExhausted at once.
//
// The daemon's resident memory is checked while the admitted builds are
// stalled (it grew by about 2 GiB before).
func TestBuildsBoundDaemonMemory(t *testing.T) {
	d := startDaemon(t)
	reg := startStallRegistry(t)
	pid := d.cmd.Process.Pid
	c := d.client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base := vmRSS(t, pid)

	dir := func(size int) string {
		t.Helper()
		dir := t.TempDir()
		data := make([]byte, size)
		_, _ = rand.Read(data)
		if err := os.WriteFile(filepath.Join(dir, "blob"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	type result struct {
		repo string
		err  error
	}
	// run starts n builds of dockerfile(repo) over contextDir, one after
	// the other once the last was refused or is stalled in its FROM's pull
	// (so that what is measured is what builds hold, not n requests being
	// read at once).
	run := func(name string, n int, contextDir string, dockerfile func(from string) string) []result {
		t.Helper()
		res := make([]result, n)
		for i := range n {
			repo := fmt.Sprintf("%s%d", name, i)
			res[i].repo = repo
			ended := make(chan error, 1)
			go func() {
				_, err := c.Images().BuildDockerfile(ctx, dockerfile(reg.host+"/"+repo+":latest"), contextDir, sbx.DockerfileOptions{})
				ended <- err
			}()
			waitUntil(t, time.Minute, func() bool {
				select {
				case res[i].err = <-ended:
					if res[i].err == nil {
						t.Fatalf("build %s ended without error, its FROM never came", repo)
					}
					return true
				default:
					return reg.asked(repo)
				}
			}, func() string { return "build " + repo + ": neither refused nor stalled in its pull" })
		}
		return res
	}

	// Amplification: 1 MiB of context, 250 copies of it.
	var df strings.Builder
	for i := range 250 {
		fmt.Fprintf(&df, "COPY blob /d%d/\n", i)
	}
	amp := run("amp", 8, dir(1<<20), func(from string) string { return "FROM " + from + "\n" + df.String() })
	for _, r := range amp {
		if r.err == nil || codeOf(r.err) != connect.CodeInvalidArgument || !strings.Contains(r.err.Error(), "COPY") {
			t.Errorf("build %s copying a 1 MiB context 250 times: got %v, want InvalidArgument naming the COPY bound", r.repo, r.err)
		}
	}
	rss := vmRSS(t, pid)
	t.Logf("daemon RSS: %d MiB before, %d MiB with the amplifying builds", base, rss)
	if rss-base > 768 {
		t.Errorf("daemon RSS grew by %d MiB for 8 builds of 1 MiB contexts, want at most 768", rss-base)
	}

	// Many builds at once, each with a 40 MiB context copied once.
	big := run("many", 12, dir(40<<20), func(from string) string { return "FROM " + from + "\nCOPY blob /blob\n" })
	admitted := 0
	for _, r := range big {
		switch {
		case r.err == nil:
			admitted++ // stalled in its pull
		case codeOf(r.err) == connect.CodeResourceExhausted && strings.Contains(r.err.Error(), "builds under way"):
		default:
			t.Errorf("build %s: got %v, want it stalled or refused with ResourceExhausted naming the builds under way", r.repo, r.err)
		}
	}
	rss = vmRSS(t, pid)
	t.Logf("daemon RSS: %d MiB with %d of 12 builds of 40 MiB contexts admitted", rss, admitted)
	if admitted > 3 {
		t.Errorf("%d builds of 40 MiB contexts admitted at once for one tenant, want at most 3", admitted)
	}
	if rss-base > 1024 {
		t.Errorf("daemon RSS grew by %d MiB, want at most 1024", rss-base)
	}
	cancel()
}
