package integration

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

// countersPy attacks ("attack <what>") or probes ("probe") the kernel's
// per-user counters. An attack takes all it can of one counter as box
// uids 0, 1000 and 2000 in turn, each in a process of its own that keeps
// what it took, and prints "held <total> <per uid...>" once all hold; the
// processes carry "sbxattack" in their command line so they can be killed.
// The probe prints "<what> ok|<error>" for one of each counter.
const countersPy = `
import ctypes, errno, fcntl, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def err(): return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
class MqAttr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(MqAttr)]
def mq(name, maxmsg, msgsize):
    return libc.mq_open(name.encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(MqAttr(0, maxmsg, msgsize, 0)))
CAP = 300000
def take(what):
    n = 0
    if what == "inotify-instances":
        while n < CAP and libc.inotify_init1(0) >= 0: n += 1
    elif what == "inotify-watches":
        while n < CAP:
            fd = libc.inotify_init1(0)
            if fd < 0: break
            for i in range(2000):
                if libc.inotify_add_watch(fd, ("/tmp/w/%d" % i).encode(), 2) < 0: return n
                n += 1
    elif what == "sigqueue":
        sig = signal.SIGRTMIN
        signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
        val = (ctypes.c_char * 8)()
        while n < CAP and libc.sigqueue(os.getpid(), sig, val) == 0: n += 1
    elif what == "pipes":
        held = []
        while n < CAP:
            r, w = os.pipe()
            held.append((r, w))
            try: fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
            except OSError: break
            n += 256
        take.held = held
    elif what == "mqueue":
        while n < CAP and mq("/sbxattack-%d-%d" % (os.getuid(), n), 1, 1024) >= 0: n += 1
    return n
def probe():
    fd = libc.inotify_init1(0)
    print("inotify", "ok" if fd >= 0 and libc.inotify_add_watch(fd, b"/", 2) >= 0 else err())
    sig = signal.SIGRTMIN + 1
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    print("sigqueue", "ok" if libc.sigqueue(os.getpid(), sig, (ctypes.c_char * 8)()) == 0 else err())
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        print("pipe", "ok" if fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) >= 1 << 20 else "small")
    except OSError as e:
        print("pipe", errno.errorcode[e.errno])
    name = "/sbxprobe-%d" % os.getpid()
    q = mq(name, 2, 1024)
    print("mqueue", "ok" if q >= 0 else err())
    if q >= 0: libc.mq_unlink(name.encode())
if sys.argv[1] == "probe":
    probe()
    sys.exit(0)
what = sys.argv[2]
if what == "inotify-watches":
    os.makedirs("/tmp/w", exist_ok=True)
    for i in range(2000): open("/tmp/w/%d" % i, "w").close()
counts = []
for uid in (0, 1000, 2000):
    r, w = os.pipe()
    if os.fork() == 0:
        os.setgid(uid); os.setuid(uid)
        os.write(w, b"%d\n" % take(what))
        while True: time.sleep(60)
    counts.append(int(os.read(r, 32)))
print("held", sum(counts), *counts, flush=True)
while True: time.sleep(60)
`

// TestKernelCountersPerBox: one box takes all it can of each per-user
// kernel counter (inotify instances and watches, queued RT signals, pipe
// buffer pages, POSIX message queue bytes), as three of its uids. A
// neighbour box and host root must still get one of each while it holds
// them and after it ends, and for the counters sbx serve
// --box-kernel-limits bounds, the box's total across its uids must stay
// within the configured limit. With every box sharing host uid 100000
// (before per-box ranges) the neighbour and host root failed; with a
// range but no limits of the box's own, the attacker got the host's
// per-user allowance (128 inotify instances, ~200k watches, ~96k signals,
// 256 queues) whatever was configured.
func TestKernelCountersPerBox(t *testing.T) {
	limits := map[string]int{"inotify-instances": 32, "inotify-watches": 8192, "sigqueue": 1024, "mqueue": 64}
	d := startDaemon(t, "--box-kernel-limits", fmt.Sprintf("inotify_instances=%d,inotify_watches=%d,sigpending=%d,msgqueue=%d",
		limits["inotify-instances"], limits["inotify-watches"], limits["sigqueue"], limits["mqueue"]*1024))
	ctx := ctxT(t, 5*time.Minute)
	neighbour := newBox(t, ctx, d, sbx.CreateOptions{})
	probe := func(t *testing.T, where string, run func(argv ...string) (string, error)) {
		t.Helper()
		out, err := run("/usr/bin/python3", "-c", countersPy, "probe")
		if err != nil {
			t.Fatalf("probe in %s: %v: %s", where, err, out)
		}
		if want := "inotify ok\nsigqueue ok\npipe ok\nmqueue ok\n"; out != want {
			t.Errorf("%s: got %q, want %q", where, out, want)
		}
	}
	inBox := func(sb *sbx.Sandbox) func(argv ...string) (string, error) {
		return func(argv ...string) (string, error) {
			res, err := sb.Run(ctx, argv...)
			if err != nil {
				return "", err
			}
			return string(res.Stdout) + string(res.Stderr), nil
		}
	}
	onHost := func(argv ...string) (string, error) {
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
		return string(out), err
	}
	for _, attack := range []string{"inotify-instances", "inotify-watches", "sigqueue", "pipes", "mqueue"} {
		t.Run(attack, func(t *testing.T) {
			attacker := newBox(t, ctx, d, sbx.CreateOptions{})
			start := time.Now()
			mustRun(t, ctx, attacker, fmt.Sprintf("/usr/bin/python3 -c '%s' sbxattack %s > /tmp/attack.out 2>&1 &", countersPy, attack))
			var out string
			for {
				out = mustRun(t, ctx, attacker, "cat /tmp/attack.out")
				if strings.HasPrefix(out, "held ") || strings.Contains(out, "Error") {
					break
				}
				if time.Since(start) > 10*time.Second {
					t.Fatalf("attack %s did not finish in 10 s: %q", attack, out)
				}
				time.Sleep(50 * time.Millisecond)
			}
			f := strings.Fields(out)
			total, err := strconv.Atoi(f[1])
			if err != nil || total <= 0 {
				t.Fatalf("attack %s: %q", attack, out)
			}
			t.Logf("attacker %s (total, then as uids 0, 1000, 2000) after %v", strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))
			if limit, ok := limits[attack]; ok && total > limit {
				t.Errorf("attack %s: the box took %d, above its configured limit %d", attack, total, limit)
			}
			probe(t, "neighbour box during the attack", inBox(neighbour))
			probe(t, "host root during the attack", onHost)
			// The attack ends: its processes die (the pattern does not match
			// this shell's own command line) and its queues, which outlive
			// them, are removed.
			mustRun(t, ctx, attacker, "pkill -9 -f 'sbxatt[a]ck'; while pgrep -f 'sbxatt[a]ck' >/dev/null; do sleep 0.05; done; rm -f /dev/mqueue/sbxatt[a]ck-*")
			probe(t, "neighbour box after the attack", inBox(neighbour))
			probe(t, "host root after the attack", onHost)
			probe(t, "attacker after the attack", inBox(attacker))
		})
	}
	// The limits are the box's parent namespace's: box root can neither
	// see nor change them (its own /proc/sys is read-only).
	res, err := neighbour.RunShell(ctx, "cat /proc/sys/user/max_inotify_instances; echo 100000 > /proc/sys/user/max_inotify_instances")
	if err != nil {
		t.Fatal(err)
	}
	if res.Code == 0 || !strings.Contains(string(res.Stderr), "Read-only file system") {
		t.Errorf("box root writing /proc/sys/user: exit %d, stderr %q, want a read-only file system", res.Code, res.Stderr)
	}
}
