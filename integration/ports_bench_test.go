package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"
)

// TestPortProxyLatency measures a small HTTP GET through the port proxy
// (path routing, token on, keep-alive) against the same GET sent directly
// to the same server script running on the host's loopback, interleaved in
// one run, and prints the p50s and their ratio. Skipped with -short.
func TestPortProxyLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("latency benchmark")
	}
	d := startDaemonToken(t, portToken)
	ctx := ctxT(t, 3*time.Minute)
	sb := portSandbox(t, ctx, d)
	proxied, err := sb.PortURL(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}

	// The baseline: the same server on the host.
	hostPort := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	hp, tp := hostPort(), hostPort()
	srv := exec.Command("/usr/bin/python3", "testdata/portserver.py")
	srv.Env = append(os.Environ(), fmt.Sprintf("PORT_HTTP=%d", hp), fmt.Sprintf("PORT_TCP=%d", tp))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	direct := fmt.Sprintf("http://127.0.0.1:%d/", hp)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(direct); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the host server did not start")
		}
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2}}
	get := func(url string, auth bool) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+portToken)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s: status %d", url, resp.StatusCode)
		}
		return nil
	}
	const n = 200
	var ds [2][]time.Duration
	for i := range n + 10 {
		for j, f := range []func() error{func() error { return get(direct, false) }, func() error { return get(proxied, true) }} {
			start := time.Now()
			if err := f(); err != nil {
				t.Fatal(err)
			}
			if i >= 10 { // warm-up
				ds[j] = append(ds[j], time.Since(start))
			}
		}
	}
	p50 := func(x []time.Duration) time.Duration {
		sort.Slice(x, func(a, b int) bool { return x[a] < x[b] })
		return x[len(x)/2]
	}
	dp, pp := p50(ds[0]), p50(ds[1])
	t.Logf("p50 of %d GETs: direct to the server on the host %v, through the port proxy (auth, agent dial, in-sandbox loopback) %v: ratio %.2fx (+%v)",
		n, dp.Round(time.Microsecond), pp.Round(time.Microsecond), float64(pp)/float64(dp), (pp - dp).Round(time.Microsecond))
}
