package integration

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// hostAllocated is the disk space (st_blocks) of every file under dir on
// dir's own file system (du -x: box tmpfs mounts below it are not the
// host's disk). The walk is the test's own and never follows a symlink.
func hostAllocated(t *testing.T, dir string) int64 {
	t.Helper()
	var top syscall.Stat_t
	if err := syscall.Lstat(dir, &top); err != nil {
		t.Fatal(err)
	}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walked (temp files)
			}
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st.Dev != top.Dev {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestSnapshotSparseFiles: a 64 MiB box makes files whose apparent size is
// far past its disk limit (holes), then is snapshotted. The host must not
// allocate that size anywhere (blob, unpacked layer, temp files): a layer
// within the daemon's cap keeps its holes and its content in a new
// sandbox; one past the cap fails with ResourceExhausted naming the limit.
// The daemon answers other requests meanwhile.
func TestSnapshotSparseFiles(t *testing.T) {
	d := startDaemon(t)
	ctx := ctxT(t, 5*time.Minute)
	c := d.client()
	const maxNew = 64 << 20 // what the host may allocate for one snapshot

	neighbour, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(neighbour.ID)

	t.Run("2GiB", func(t *testing.T) {
		sb, err := c.Create(ctx, sbx.CreateOptions{DiskBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		// Data at the start, in the middle and at the end; the rest holes.
		mustRun(t, ctx, sb, "truncate -s 2G /big && printf head | dd of=/big conv=notrunc status=none && "+
			"printf middle | dd of=/big bs=1 seek=1073741824 conv=notrunc status=none && "+
			"printf tail | dd of=/big bs=1 seek=2147483644 conv=notrunc status=none && "+
			"head -c 1048576 /dev/urandom > /rand && truncate -s 4M /rand")
		want := mustRun(t, ctx, sb, "sha256sum /big /rand | cut -c1-64; stat -c %s /big /rand")

		before := hostAllocated(t, d.dataDir)
		start := time.Now()
		if _, err := sb.Snapshot(ctx, "local/sparse:1"); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		grew := hostAllocated(t, d.dataDir) - before
		t.Logf("snapshot of a 2 GiB sparse file: %v, host allocation grew by %d KiB", time.Since(start).Round(time.Millisecond), grew>>10)
		if grew > maxNew {
			t.Errorf("host allocation grew by %d MiB for a 64 MiB box's snapshot; want ≤ %d MiB (holes kept)", grew>>20, maxNew>>20)
		}

		sb2, err := c.Create(ctx, sbx.CreateOptions{Image: "local/sparse:1", DiskBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb2.ID)
		if got := mustRun(t, ctx, sb2, "sha256sum /big /rand | cut -c1-64; stat -c %s /big /rand"); got != want {
			t.Errorf("in a sandbox of the snapshot: sums and sizes\n%s\nwant\n%s", got, want)
		}
		// Still sparse as seen in the new box (its lower layer is the host's copy).
		if got := strings.TrimSpace(mustRun(t, ctx, sb2, "stat -c %b /big")); len(got) > 5 {
			t.Errorf("/big in the new sandbox has %s blocks allocated; want a sparse file", got)
		}
		for _, s := range []*sbx.Sandbox{sb, sb2} {
			if err := s.Destroy(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("10x1GiB", func(t *testing.T) {
		sb, err := c.Create(ctx, sbx.CreateOptions{DiskBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		d.remember(sb.ID)
		mustRun(t, ctx, sb, "mkdir /many && for i in 0 1 2 3 4 5 6 7 8 9; do truncate -s 1G /many/$i && "+
			"printf x$i | dd of=/many/$i bs=1 seek=536870912 conv=notrunc status=none; done")
		before := hostAllocated(t, d.dataDir)
		done := make(chan error, 1)
		go func() {
			_, err := sb.Snapshot(ctx, "local/sparse:10")
			done <- err
		}()
		// The daemon keeps serving other sandboxes while it runs.
		for i := 0; ; i++ {
			select {
			case err = <-done:
			default:
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				res, rerr := neighbour.RunShell(cctx, "echo alive")
				cancel()
				if rerr != nil || string(res.Stdout) != "alive\n" {
					t.Fatalf("neighbour exec during the snapshot (round %d): %v %v", i, res, rerr)
				}
				continue
			}
			break
		}
		grew := hostAllocated(t, d.dataDir) - before
		t.Logf("snapshot of 10 × 1 GiB sparse files: err %v, host allocation grew by %d KiB", err, grew>>10)
		if grew > maxNew {
			t.Errorf("host allocation grew by %d MiB; want ≤ %d MiB", grew>>20, maxNew>>20)
		}
		// 10 GiB of apparent size is past the daemon's default layer cap (8 GiB).
		if code := connect.CodeOf(unwrapSDK(err)); code != connect.CodeResourceExhausted ||
			!strings.Contains(err.Error(), "--max-layer-size") {
			t.Errorf("snapshot error %v (code %v); want ResourceExhausted naming --max-layer-size", err, code)
		}
		if got := mustRun(t, ctx, sb, "echo thawed"); got != "thawed\n" {
			t.Errorf("after the refused snapshot: %q", got)
		}
		if err := sb.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if err := neighbour.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	d.assertNoLeaks()
}

// TestSnapshotSparseFilesRaisedCap: with --max-layer-size raised past their
// apparent size, ten 1 GiB sparse files snapshot fine: the host keeps their
// holes, a new sandbox sees their contents, and the daemon keeps serving a
// neighbour while the layer (10 GiB as a reader sees it) is unpacked.
func TestSnapshotSparseFilesRaisedCap(t *testing.T) {
	d := startDaemon(t, "--max-layer-size", "16G")
	ctx := ctxT(t, 5*time.Minute)
	c := d.client()
	neighbour, err := c.Create(ctx, sbx.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(neighbour.ID)
	sb, err := c.Create(ctx, sbx.CreateOptions{DiskBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb.ID)
	const script = "mkdir /many && for i in 0 1 2 3 4 5 6 7 8 9; do truncate -s 1G /many/$i && " +
		"printf x$i | dd of=/many/$i bs=1 seek=536870912 conv=notrunc status=none; done"
	const check = "for i in 0 1 2 3 4 5 6 7 8 9; do stat -c '%s %b' /many/$i; dd if=/many/$i bs=1 skip=536870912 count=2 status=none; echo; done"
	mustRun(t, ctx, sb, script)
	want := mustRun(t, ctx, sb, check)

	before := hostAllocated(t, d.dataDir)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := sb.Snapshot(ctx, "local/sparse:many")
		done <- err
	}()
	rounds := 0
	for err = nil; ; rounds++ {
		select {
		case err = <-done:
		default:
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, rerr := neighbour.RunShell(cctx, "echo alive")
			cancel()
			if rerr != nil || string(res.Stdout) != "alive\n" {
				t.Fatalf("neighbour exec during the snapshot (round %d): %v %v", rounds, res, rerr)
			}
			continue
		}
		break
	}
	if err != nil {
		t.Fatalf("snapshot under a 16 GiB cap: %v", err)
	}
	grew := hostAllocated(t, d.dataDir) - before
	t.Logf("snapshot of 10 × 1 GiB sparse files: %v, %d neighbour execs meanwhile, host allocation grew by %d KiB",
		time.Since(start).Round(time.Millisecond), rounds, grew>>10)
	if grew > 64<<20 {
		t.Errorf("host allocation grew by %d MiB; want ≤ 64 MiB", grew>>20)
	}
	sb2, err := c.Create(ctx, sbx.CreateOptions{Image: "local/sparse:many"})
	if err != nil {
		t.Fatal(err)
	}
	d.remember(sb2.ID)
	if got := mustRun(t, ctx, sb2, check); got != want {
		t.Errorf("in a sandbox of the snapshot:\n%s\nwant\n%s", got, want)
	}
	for _, s := range []*sbx.Sandbox{sb, sb2, neighbour} {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d.assertNoLeaks()
}
