package idmap

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Limits bound what all the processes of one box together may hold of the
// kernel's per-user counters, whatever uids in the box they run as and
// however deeply they nest user namespaces. Keys are the names of
// /proc/sys/user/max_<name> (user_namespaces, inotify_instances, ...) and
// the rlimit-counted "sigpending" (queued signals, RLIMIT_SIGPENDING) and
// "msgqueue" (POSIX message queue bytes, RLIMIT_MSGQUEUE).
//
// How they apply (BoxNamespace): a box's user namespace is made inside a
// namespace of its own, "the box's parent", owned by the box's first host
// uid. The kernel charges an object made in a namespace to (that
// namespace, creator's uid), checked against that namespace's limit, and
// then to (its parent, its owner) at every level up. Everything in a box,
// made by any of its uids, is so charged to one entry of the box's parent,
// whose max_* the helper sets before making the box's namespace, and
// whose rlimit ceilings are the helper's own rlimits when it makes it. No
// process of the box ever runs in the box's parent, so none can change
// them; the kernel still checks the host's limits above.
//
// Limits set in the box's own namespace would not do: they count per uid
// of that namespace, and box root can take each limit again as every one
// of its 65536 uids.
type Limits map[string]int64

// rlimitNames are the Limits keys that are resource limits, not
// /proc/sys/user files.
var rlimitNames = []string{"sigpending", "msgqueue"}

// sysctlNames are the Limits keys that are /proc/sys/user/max_<name>.
var sysctlNames = []string{
	"user_namespaces", "mnt_namespaces", "pid_namespaces", "net_namespaces", "ipc_namespaces",
	"uts_namespaces", "cgroup_namespaces", "time_namespaces",
	"inotify_instances", "inotify_watches", "fanotify_groups", "fanotify_marks",
}

// DefaultLimits are what a box may hold unless configured otherwise: the
// kernel's own per-user defaults where it has fixed ones (128 inotify and
// fanotify instances, 800 KiB of message queues), and room for a box that
// runs containers of its own.
func DefaultLimits() Limits {
	return Limits{
		"user_namespaces": 64, "mnt_namespaces": 512, "pid_namespaces": 256, "net_namespaces": 256,
		"ipc_namespaces": 256, "uts_namespaces": 256, "cgroup_namespaces": 256, "time_namespaces": 256,
		"inotify_instances": 128, "inotify_watches": 65536, "fanotify_groups": 128, "fanotify_marks": 65536,
		"sigpending": 16384, "msgqueue": 819200,
	}
}

// LimitNames lists every key Limits takes, sorted.
func LimitNames() []string {
	return slices.Sorted(slices.Values(append(slices.Clone(sysctlNames), rlimitNames...)))
}

func known(name string) bool {
	return slices.Contains(sysctlNames, name) || slices.Contains(rlimitNames, name)
}

// ParseLimits reads "name=value,name=value" over DefaultLimits: names are
// LimitNames, values non-negative integers. "" gives DefaultLimits.
func ParseLimits(s string) (Limits, error) { return parseLimits(s, DefaultLimits()) }

// parseLimits reads s over l.
func parseLimits(s string, l Limits) (Limits, error) {
	if strings.TrimSpace(s) == "" {
		return l, nil
	}
	for _, kv := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("box kernel limit %q: want name=value: %w", kv, errdefs.ErrInvalidArgument)
		}
		if !known(name) {
			return nil, fmt.Errorf("box kernel limit %q: unknown name (known: %s): %w", name, strings.Join(LimitNames(), ", "), errdefs.ErrInvalidArgument)
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 0 || n > 1<<31-1 {
			return nil, fmt.Errorf("box kernel limit %s=%q: want an integer from 0 to 2147483647: %w", name, val, errdefs.ErrInvalidArgument)
		}
		l[name] = n
	}
	return l, nil
}

// Validate checks every key is known and every value in 0..2^31-1.
func (l Limits) Validate() error {
	for _, name := range slices.Sorted(maps.Keys(l)) {
		if !known(name) {
			return fmt.Errorf("box kernel limit %q: unknown name: %w", name, errdefs.ErrInvalidArgument)
		}
		if v := l[name]; v < 0 || v > 1<<31-1 {
			return fmt.Errorf("box kernel limit %s=%d: want 0 to 2147483647: %w", name, v, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Clamp returns l with every value at most host's (the limits above every
// box, HostLimits) and without the names host lacks (counters this kernel
// does not have); lowered lists the names it lowered.
func (l Limits) Clamp(host Limits) (out Limits, lowered []string) {
	out = Limits{}
	for _, name := range slices.Sorted(maps.Keys(l)) {
		h, ok := host[name]
		if !ok {
			continue
		}
		v := l[name]
		if v > h {
			v = h
			lowered = append(lowered, fmt.Sprintf("%s %d to %d", name, l[name], h))
		}
		out[name] = v
	}
	return out, lowered
}

// String is the ParseLimits form, sorted by name.
func (l Limits) String() string {
	var b strings.Builder
	for i, name := range slices.Sorted(maps.Keys(l)) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%d", name, l[name])
	}
	return b.String()
}
