package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestBoxEventStreamsLeaveTheOwnersAlone: event streams are bounded per
// tenant (64), and a box's scoped token counted as its tenant, so code in
// a box opening 64 Events streams over the box endpoint locked its tenant
// (here the single-user owner) out of events. Now all of a tenant's boxes
// share a bucket of their own.
func TestBoxEventStreamsLeaveTheOwnersAlone(t *testing.T) {
	// Networking of its own (the box endpoint is on the gateway), without
	// the shared test internet.
	tag := randTag()
	var sub byte
	_, _ = fmt.Sscanf(tag[:2], "%02x", &sub)
	bridge := "sbxv" + tag
	t.Cleanup(func() { removeNetworking(bridge, bridge) })
	d := startDaemon(t, "--network=true", "--net-bridge", bridge, "--net-table", bridge,
		"--net-subnet", fmt.Sprintf("10.217.%d.0/24", sub), "--dns-upstream", "127.0.0.1:53", "--net-pool", "0")
	ctx := ctxT(t, 3*time.Minute)
	c := d.client()
	sb, err := c.Create(ctx, sbx.CreateOptions{ScopedToken: true})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	// 64 Connect streams, each an enveloped empty EventsRequest, held open.
	const streams = 64
	if _, err := sb.RunShell(ctx, fmt.Sprintf(`for i in $(seq %d); do
		printf '\0\0\0\0\2{}' | curl -sN --max-time 600 -H "Authorization: Bearer $SBX_TOKEN" \
			-H 'Content-Type: application/connect+json' --data-binary @- \
			"$SBX_ADDR/sbx.v1.ObserveService/Events" >/tmp/ev.$i 2>&1 &
	done`, streams)); err != nil {
		t.Fatal(err)
	}
	// The daemon counts the open streams (sbx_event_subscribers).
	waitUntil(t, time.Minute, func() bool { return subscribers(t, d) >= streams }, func() string {
		return fmt.Sprintf("the box's %d streams are not all open: %d", streams, subscribers(t, d))
	})
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, err := range c.Events(qctx, &sbxv1.EventsRequest{NoFollow: true}) {
		if err != nil {
			t.Errorf("the owner's event stream while a box holds %d: %v, want it served", streams, err)
		}
	}
}

// subscribers reads sbx_event_subscribers from the daemon's /metrics.
func subscribers(t *testing.T, d *daemon) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+d.addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "sbx_event_subscribers "); ok {
			var n int
			_, _ = fmt.Sscan(v, &n)
			return n
		}
	}
	return -1
}
