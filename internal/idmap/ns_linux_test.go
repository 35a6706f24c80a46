package idmap

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/testutil"
)

// takePy runs as root in a box's user namespace (entered with nsenter, no
// seccomp): it raises its own namespace's limits (which it may: it has
// every capability there), then as box uids 0, 1 and 2 in turn takes all
// it can of nested user namespaces, inotify instances and queued signals,
// each holder keeping what it took until the script ends, and prints each
// total.
const takePy = `
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
for f in ("max_user_namespaces", "max_inotify_instances"):
    open("/proc/sys/user/" + f, "w").write("100000")
hold_r, hold_w = os.pipe()
def holder(f):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(hold_w)
        os.write(w, b"1" if f() else b"0")
        os.read(hold_r, 1)
        os._exit(0)
    return os.read(r, 1) == b"1"
def take(what):
    n = 0
    if what == "userns":
        while n < 50 and holder(lambda: libc.unshare(0x10000000) == 0): n += 1
    elif what == "inotify":
        while n < 1000 and libc.inotify_init1(0) >= 0: n += 1
    elif what == "sigqueue":
        sig = signal.SIGRTMIN
        signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
        while n < 100000 and libc.sigqueue(os.getpid(), sig, (ctypes.c_char * 8)()) == 0: n += 1
    return n
for what in ("userns", "inotify", "sigqueue"):
    total = 0
    for uid in (0, 1, 2):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(hold_w)
            os.setgid(uid); os.setuid(uid)
            os.write(w, b"%d" % take(what))
            os.read(hold_r, 1)
            os._exit(0)
        total += int(os.read(r, 16))
    print(what, total)
`

// TestBoxNamespaceLimits: whatever uids a box's processes use, and even
// with every capability in the box's namespace (no seccomp here), they
// together get what Limits allow and no more: the limits are its parent
// namespace's, which nothing in the box can change. Limits set in the box's
// own namespace would count per uid (three uids, three times the limit).
func TestBoxNamespaceLimits(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, bin := range []string{"/usr/bin/nsenter", "/usr/bin/python3"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	alloc, err := NewAllocator("", DefaultPool) // host-wide: no live box's range
	if err != nil {
		t.Fatal(err)
	}
	owner := t.TempDir()
	r, err := alloc.Allocate(owner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = alloc.Release(r, owner) })
	ns := filepath.Join(t.TempDir(), "userns")
	if err := os.WriteFile(ns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lim := Limits{"user_namespaces": 3, "inotify_instances": 5, "sigpending": 40}
	parent, err := BoxNamespace(r, testutil.AgentBinary(t), ns, lim)
	if err != nil {
		t.Fatal(err)
	}
	parent.Close()
	t.Cleanup(func() { _ = unix.Unmount(ns, unix.MNT_DETACH) })
	out, err := exec.Command("/usr/bin/nsenter", "--user="+ns, "--setuid=0", "--setgid=0", "/usr/bin/python3", "-c", takePy).CombinedOutput()
	if err != nil {
		t.Fatalf("in the box's namespace: %v: %s", err, out)
	}
	if want := "userns 3\ninotify 5\nsigqueue 40\n"; string(out) != want {
		t.Errorf("taken by box uids 0, 1 and 2 together: got %q, want %q", out, want)
	}
}
