package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/tenant"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// sameAsMissing checks that err (an op on another tenant's object named
// ref) has the code (NotFound, or Unavailable for a failed pull) and exactly
// the message errMissing (the same op on a missing object named missing)
// has, the name replaced.
func sameAsMissing(t *testing.T, what string, err, errMissing error, ref, missing string) {
	t.Helper()
	var se, sm *sbx.Error
	// Usually NotFound; a create of a missing image tries a pull (auto-pull),
	// which offline fails as Unavailable for both alike.
	if !errors.As(err, &se) || !errors.As(errMissing, &sm) || se.Code != sm.Code ||
		(sm.Code != connect.CodeNotFound && sm.Code != connect.CodeUnavailable) ||
		se.Msg != strings.ReplaceAll(sm.Msg, missing, ref) {
		t.Errorf("%s: got %v, want %v with %s for %s (what a missing one gets)", what, err, errMissing, ref, missing)
	}
}

// tenantDaemon starts a daemon (no networking) with tenants acme
// (unlimited) and beta (storage_bytes 1 MiB), whose pulls may reach
// registries on 127.0.0.1 (the tests'). The harness's clients are acme's.
func tenantDaemon(t *testing.T) (d *daemon, a, b *sbx.Client, admin string) {
	t.Helper()
	return tenantDaemonArgs(t, "--tenant-pull-allow", "127.0.0.1/32")
}

// tenantDaemonArgs is tenantDaemon with extraArgs for the daemon instead
// of the pull allowance.
func tenantDaemonArgs(t *testing.T, extraArgs ...string) (d *daemon, a, b *sbx.Client, admin string) {
	t.Helper()
	dir := t.TempDir()
	tokA, tokB, admin := tenant.NewToken(), tenant.NewToken(), tenant.NewToken()
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, fmt.Appendf(nil, `{"tenants": [
		{"name": "acme", "tokens": [%q]},
		{"name": "beta", "tokens": [%q], "quotas": {"storage_bytes": 1048576}}], "admin_tokens": [%q]}`,
		tenant.HashToken(tokA), tenant.HashToken(tokB), tenant.HashToken(admin)), 0o600); err != nil {
		t.Fatal(err)
	}
	d = startDaemonOpts(t, daemonOpts{token: tokA}, append([]string{"--tenants", tenants}, extraArgs...)...)
	a, b = d.client(), sbx.NewClient(d.url(), sbx.WithToken(tokB))
	t.Cleanup(func() {
		a.Close()
		list, _ := b.List(context.Background())
		for _, sb := range list {
			_ = sb.Destroy(context.Background())
		}
		b.Close()
	})
	return d, a, b, admin
}

// TestTenantCodebasesAndSnapshots: with two tenants on a real daemon, beta
// cannot list, see, download, mount, sync or delete acme's codebase, nor
// see, use or make snapshots of acme's; names are per tenant; acme's
// codebase and images are untouched by beta's attempts.
func TestTenantCodebasesAndSnapshots(t *testing.T) {
	d, a, b, _ := tenantDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	src := t.TempDir()
	writeTree(t, src, map[string]string{"secret.txt": "acme's secret\n"})
	up, err := a.CreateCodebase(ctx, src, sbx.UploadOptions{Name: "proj"})
	if err != nil {
		t.Fatalf("acme's codebase: %v", err)
	}
	id := up.GetCodebase().GetId()

	// Beta sees nothing of it: every way in answers as for a missing one.
	if list, err := b.ListCodebases(ctx); err != nil || len(list) != 0 {
		t.Errorf("beta's codebase list: got %v, %v; want empty", list, err)
	}
	for _, ref := range []string{"proj", id} {
		_, errM := b.GetCodebase(ctx, "nope")
		_, err := b.GetCodebase(ctx, ref)
		sameAsMissing(t, "beta gets acme's "+ref, err, errM, ref, "nope")
		var buf strings.Builder
		errM = b.DownloadCodebase(ctx, "nope", &buf)
		err = b.DownloadCodebase(ctx, ref, &buf)
		sameAsMissing(t, "beta downloads acme's "+ref, err, errM, ref, "nope")
		if strings.Contains(buf.String(), "secret") {
			t.Errorf("beta's download of %s got acme's file", ref)
		}
		errM = b.DeleteCodebase(ctx, "nope")
		err = b.DeleteCodebase(ctx, ref)
		sameAsMissing(t, "beta deletes acme's "+ref, err, errM, ref, "nope")
		_, errM = b.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "nope"}}})
		_, err = b.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: ref}}})
		sameAsMissing(t, "beta mounts acme's "+ref, err, errM, ref, "nope")
	}
	// Names are per tenant: beta's own proj is its own.
	srcB := t.TempDir()
	writeTree(t, srcB, map[string]string{"b.txt": "beta\n"})
	if _, err := b.CreateCodebase(ctx, srcB, sbx.UploadOptions{Name: "proj"}); err != nil {
		t.Fatalf("beta's own proj: %v", err)
	}
	boxB, err := b.Create(ctx, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "proj"}}})
	if err != nil {
		t.Fatalf("beta mounting its own proj: %v", err)
	}
	if got := mustRun(t, ctx, boxB, "ls /workspace"); got != "b.txt\n" {
		t.Errorf("beta's mount of proj: got %q, want its own b.txt only", got)
	}

	// Acme's box changes the codebase; beta cannot sync it, acme can.
	boxA := newBox(t, ctx, d, sbx.CreateOptions{Codebases: []sbx.CodebaseMount{{Codebase: "proj"}}})
	mustRun(t, ctx, boxA, "echo changed > /workspace/secret.txt")
	_, errM := b.SyncCodebase(ctx, "sb-0000000000ff", sbx.SyncOptions{})
	_, err = b.SyncCodebase(ctx, boxA.ID, sbx.SyncOptions{Force: true})
	sameAsMissing(t, "beta syncs acme's box", err, errM, boxA.ID, "sb-0000000000ff")
	if cb, err := a.GetCodebase(ctx, "proj"); err != nil || cb.GetRevision() != 1 {
		t.Errorf("acme's proj after beta's sync: got %v, %v; want revision 1", cb, err)
	}
	if _, err := a.SyncCodebase(ctx, boxA.ID, sbx.SyncOptions{}); err != nil {
		t.Fatalf("acme syncs its own box: %v", err)
	}
	if files := downloadFiles(t, a, "proj"); files["secret.txt"] != "changed\n" {
		t.Errorf("acme's proj after its sync: %v", files)
	}

	// Snapshots land in the snapshotting tenant's own image store.
	mustRun(t, ctx, boxA, "echo snap > /marker")
	if _, err := boxA.Snapshot(ctx, "local/snap:1"); err != nil {
		t.Fatalf("acme snapshots its box: %v", err)
	}
	_, errM = b.Images().Get(ctx, "local/nope:1")
	_, err = b.Images().Get(ctx, "local/snap:1")
	sameAsMissing(t, "beta gets acme's snapshot", err, errM, "local/snap:1", "local/nope:1")
	_, errM = b.Create(ctx, sbx.CreateOptions{Image: "local/nope:1"})
	_, err = b.Create(ctx, sbx.CreateOptions{Image: "local/snap:1"})
	sameAsMissing(t, "beta creates from acme's snapshot", err, errM, "local/snap:1", "local/nope:1")
	_, errM = b.Sandbox("sb-0000000000ff").Snapshot(ctx, "local/stolen:1")
	_, err = b.Sandbox(boxA.ID).Snapshot(ctx, "local/stolen:1")
	sameAsMissing(t, "beta snapshots acme's box", err, errM, boxA.ID, "sb-0000000000ff")
	fromSnap := newBox(t, ctx, d, sbx.CreateOptions{Image: "local/snap:1"})
	if got := mustRun(t, ctx, fromSnap, "cat /marker"); got != "snap\n" {
		t.Errorf("acme's box from its snapshot: /marker = %q", got)
	}
	if _, err := a.Images().Get(ctx, "local/stolen:1"); !isCode(err, connect.CodeNotFound) {
		t.Errorf("beta's refused snapshot of acme's box left an image in acme's store: %v", err)
	}
}

func isCode(err error, code connect.Code) bool {
	var se *sbx.Error
	return errors.As(err, &se) && se.Code == code
}

// TestTenantStorageQuota: a tenant's storage quota (1 MiB for beta) bounds
// its codebases and snapshots: the excess is ResourceExhausted naming
// storage_bytes and leaves nothing behind (no codebase, no upload or tree
// on disk, no image), and GetTenant, `sbx tenant` and the admin token's
// list report the usage.
func TestTenantStorageQuota(t *testing.T) {
	d, a, b, admin := tenantDaemon(t)
	ctx := ctxT(t, 4*time.Minute)
	big := t.TempDir()
	writeTree(t, big, map[string]string{"blob.bin": strings.Repeat("x", 2<<20)})
	_, err := b.CreateCodebase(ctx, big, sbx.UploadOptions{Name: "big"})
	if !isCode(err, connect.CodeResourceExhausted) || !strings.Contains(err.Error(), "storage_bytes") {
		t.Fatalf("beta's 2 MiB codebase past its 1 MiB quota: got %v, want ResourceExhausted naming storage_bytes", err)
	}
	if list, err := b.ListCodebases(ctx); err != nil || len(list) != 0 {
		t.Errorf("beta's codebases after the refusal: got %v, %v; want none", list, err)
	}
	for _, sub := range []string{"trees", "tmp"} {
		if ents, err := os.ReadDir(filepath.Join(d.dataDir, "codebases", sub)); err != nil || len(ents) != 0 {
			t.Errorf("codebases/%s after the refused upload: %d entries, %v; want none", sub, len(ents), err)
		}
	}
	// The neighbour is unaffected.
	if _, err := a.CreateCodebase(ctx, big, sbx.UploadOptions{Name: "big"}); err != nil {
		t.Errorf("acme's 2 MiB codebase while beta is refused: %v", err)
	}

	// A snapshot past the quota is undone.
	box, err := b.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before, err := b.Tenant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, ctx, box, "head -c 2097152 /dev/urandom > /blob")
	_, err = box.Snapshot(ctx, "local/big:1")
	if !isCode(err, connect.CodeResourceExhausted) || !strings.Contains(err.Error(), "storage_bytes") {
		t.Fatalf("beta's 2 MiB snapshot past its quota: got %v, want ResourceExhausted naming storage_bytes", err)
	}
	if _, err := b.Images().Get(ctx, "local/big:1"); !isCode(err, connect.CodeNotFound) {
		t.Errorf("the refused snapshot: got %v, want it removed (NotFound)", err)
	}
	after, err := b.Tenant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := after.GetUsage().GetStorageBytes(), before.GetUsage().GetStorageBytes(); got != want || got > 1<<20 {
		t.Errorf("beta's storage after the refused snapshot: %d bytes, want %d as before (within 1 MiB)", got, want)
	}
	if after.GetName() != "beta" || after.GetQuotas().GetStorageBytes() != 1<<20 || after.GetUsage().GetSandboxes() != 1 {
		t.Errorf("beta's tenant: got %v; want beta, 1 MiB of storage, 1 sandbox", after)
	}
	// A small snapshot fits.
	mustRun(t, ctx, box, "rm /blob && echo small > /small")
	if _, err := box.Snapshot(ctx, "local/small:1"); err != nil {
		t.Errorf("beta's small snapshot within its quota: %v", err)
	}

	out, errOut, code := d.cli("", "tenant")
	if code != 0 || !strings.Contains(out, "tenant: acme") || !strings.Contains(out, "codebases") {
		t.Errorf("sbx tenant as acme: exit %d, %q %q", code, out, errOut)
	}
	ad := sbx.NewClient(d.url(), sbx.WithToken(admin))
	defer ad.Close()
	ts, err := ad.ListTenants(ctx)
	if err != nil || len(ts) != 2 || ts[0].GetName() != "acme" || ts[0].GetUsage().GetCodebasesBytes() != 2<<20 || ts[1].GetUsage().GetSandboxes() != 1 {
		t.Errorf("admin's tenant list: got %v, %v; want acme with its 2 MiB codebase and beta with 1 sandbox", ts, err)
	}
	if _, err := ad.List(ctx); !isCode(err, connect.CodePermissionDenied) {
		t.Errorf("the admin token listing sandboxes: got %v, want PermissionDenied (it is no tenant)", err)
	}
	if _, err := a.ListTenants(ctx); !isCode(err, connect.CodePermissionDenied) {
		t.Errorf("acme listing tenants: got %v, want PermissionDenied", err)
	}
}
