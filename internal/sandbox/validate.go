package sandbox

import (
	"crypto/rand"
	"fmt"
	"path"
	"regexp"
	"strings"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

var (
	nameRe     = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	idRe       = regexp.MustCompile(`^sb-[a-z0-9]{12}$`)
	labelKeyRe = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9_./-]{0,62})$`)
	envKeyRe   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newID returns a fresh sandbox id, e.g. "sb-k3x9q0v2m7ab".
func newID() string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return "sb-" + string(b)
}

// IsID reports whether s has the shape of a sandbox id.
func IsID(s string) bool { return idRe.MatchString(s) }

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// Limits bounds what a create request may ask for.
type Limits struct {
	MinMemoryBytes, MaxMemoryBytes int64
	MinCPUMillis, MaxCPUMillis     int64
	MinPids, MaxPids               int64
	MinDiskBytes, MaxDiskBytes     int64
	MaxTimeoutMs                   int64
}

// Bounds on what one request may carry. A create or exec is data the daemon
// keeps in memory, stores and relays; past these it is refused with
// InvalidArgument before any work (100k labels or env vars once cost the
// daemon 515 MB and an 18 s create).
const (
	maxLabels = 256
	// maxEnv bounds env and secrets together.
	maxEnv  = 4096
	maxArgs = 4096
	// maxValueBytes bounds one env value or argument: Linux's
	// MAX_ARG_STRLEN, past which execve fails anyway.
	maxValueBytes = 128 << 10
	// maxExecBytes bounds argv and env together, well under ARG_MAX.
	maxExecBytes = 1 << 20
	// maxPathBytes bounds paths (workdir, mount paths): PATH_MAX - 1.
	maxPathBytes = 4095
	// maxMounts bounds volumes, codebases and path policies, each.
	maxMounts = 64
)

// CheckArgsEnv bounds a command's arguments and environment (what names the
// request in errors: "command", "exec").
func CheckArgsEnv(what string, args []string, env ...map[string]string) error {
	if len(args) > maxArgs {
		return invalid("%s: %d arguments, at most %d", what, len(args), maxArgs)
	}
	total := 0
	for i, a := range args {
		if len(a) > maxValueBytes {
			return invalid("%s argument %d: %d bytes, at most %d", what, i, len(a), maxValueBytes)
		}
		total += len(a) + 1
	}
	n := 0
	for _, m := range env {
		n += len(m)
	}
	if n > maxEnv {
		return invalid("%s: %d environment variables, at most %d", what, n, maxEnv)
	}
	for _, m := range env {
		for k, v := range m {
			if len(k)+len(v) > maxValueBytes {
				return invalid("%s environment variable %.64q: %d bytes, at most %d", what, k, len(k)+len(v), maxValueBytes)
			}
			total += len(k) + len(v) + 2
		}
	}
	if total > maxExecBytes {
		return invalid("%s: arguments and environment are %d bytes, at most %d", what, total, maxExecBytes)
	}
	return nil
}

// checkPath bounds a path given in a request.
func checkPath(what, p string) error {
	if len(p) > maxPathBytes {
		return invalid("%s: %d bytes, at most %d", what, len(p), maxPathBytes)
	}
	return nil
}

func validateCreate(req *sbxv1.CreateSandboxRequest, lim Limits) error {
	if n := len(req.GetLabels()); n > maxLabels {
		return invalid("labels: %d given, at most %d", n, maxLabels)
	}
	if err := CheckArgsEnv("command", req.GetCommand(), req.GetEnv(), req.GetSecrets()); err != nil {
		return err
	}
	if err := checkPath("workdir", req.GetWorkdir()); err != nil {
		return err
	}
	for what, n := range map[string]int{"volumes": len(req.GetVolumes()), "codebases": len(req.GetCodebases()), "path_policies": len(req.GetPathPolicies())} {
		if n > maxMounts {
			return invalid("%s: %d given, at most %d", what, n, maxMounts)
		}
	}
	if req.GetName() != "" {
		if !nameRe.MatchString(req.GetName()) {
			return invalid("name %q: must match [a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}", req.GetName())
		}
		if IsID(req.GetName()) {
			return invalid("name %q: looks like a sandbox id; pick another", req.GetName())
		}
	}
	if err := checkLabels(req.GetLabels()); err != nil {
		return err
	}
	for what, m := range map[string]map[string]string{"env": req.GetEnv(), "secret": req.GetSecrets()} {
		for k, v := range m {
			if !envKeyRe.MatchString(k) {
				return invalid("%s name %q: must match [A-Za-z_][A-Za-z0-9_]*", what, k)
			}
			if strings.ContainsRune(v, 0) {
				return invalid("%s %q: value contains a NUL byte", what, k)
			}
		}
	}
	for k := range req.GetSecrets() {
		if _, dup := req.GetEnv()[k]; dup {
			return invalid("%q is given both as env and as a secret", k)
		}
	}
	for i, a := range req.GetCommand() {
		if strings.ContainsRune(a, 0) {
			return invalid("command argument %d contains a NUL byte", i)
		}
	}
	if wd := req.GetWorkdir(); wd != "" && (!path.IsAbs(wd) || strings.ContainsRune(wd, 0)) {
		return invalid("workdir %q: must be an absolute path", wd)
	}
	if err := checkLimits(req.GetResources(), lim); err != nil {
		return err
	}
	if t := req.GetTimeoutMs(); t < 0 || (lim.MaxTimeoutMs > 0 && t > lim.MaxTimeoutMs) {
		return invalid("timeout %dms: must be between 0 and %dms", t, lim.MaxTimeoutMs)
	}
	if t := req.GetIdleTimeoutMs(); t < 0 {
		return invalid("idle timeout %dms: must not be negative", t)
	}
	if req.GetIdleAction() < sbxv1.IdleAction_IDLE_ACTION_UNSPECIFIED || req.GetIdleAction() > sbxv1.IdleAction_IDLE_ACTION_STOP {
		return invalid("idle action %d: unknown", req.GetIdleAction())
	}
	if _, err := policyOf(req.GetNetwork()); err != nil {
		return err
	}
	return validateDomainSecrets(req)
}

// checkLabels checks label keys and values.
func checkLabels(labels map[string]string) error {
	for k, v := range labels {
		if !labelKeyRe.MatchString(k) {
			return invalid("label key %q: must match [a-zA-Z0-9][a-zA-Z0-9_./-]{0,62}", k)
		}
		if len(v) > 256 || strings.ContainsFunc(v, isControl) {
			return invalid("label %q: value must be at most 256 printable characters", k)
		}
	}
	return nil
}

// checkLimits checks the limits r asks for (0: default, or unchanged for
// an update) against the host's bounds.
func checkLimits(r *sbxv1.Resources, lim Limits) error {
	if err := checkRange("memory", r.GetMemoryBytes(), lim.MinMemoryBytes, lim.MaxMemoryBytes, FormatBytes); err != nil {
		return err
	}
	if err := checkRange("cpu", r.GetCpuMillis(), lim.MinCPUMillis, lim.MaxCPUMillis, formatCPU); err != nil {
		return err
	}
	if err := checkRange("pids", r.GetPids(), lim.MinPids, lim.MaxPids, func(v int64) string { return fmt.Sprint(v) }); err != nil {
		return err
	}
	return checkRange("disk", r.GetDiskBytes(), lim.MinDiskBytes, lim.MaxDiskBytes, FormatBytes)
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// checkRange accepts 0 (meaning "default") or a value in [lo, hi].
func checkRange(what string, v, lo, hi int64, format func(int64) string) error {
	if v == 0 {
		return nil
	}
	if v < 0 {
		return invalid("%s %d: must not be negative", what, v)
	}
	if v < lo {
		return invalid("%s %s: below the minimum of %s", what, format(v), format(lo))
	}
	if hi > 0 && v > hi {
		return invalid("%s %s: above this host's maximum of %s", what, format(v), format(hi))
	}
	return nil
}

func formatCPU(m int64) string { return fmt.Sprintf("%.3g CPUs", float64(m)/1000) }

// FormatBytes renders a byte count with a binary unit, e.g. "512MiB".
func FormatBytes(v int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(v)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d%s", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

// Selector is one parsed label selector term.
type Selector struct {
	Key, Value string
	Op         string // "=", "!=", "exists", "!exists"
}

// ParseSelectors parses "k=v", "k!=v", "k" and "!k" terms.
func ParseSelectors(terms []string) ([]Selector, error) {
	var out []Selector
	for _, t := range terms {
		t = strings.TrimSpace(t)
		var s Selector
		switch {
		case strings.Contains(t, "!="):
			k, v, _ := strings.Cut(t, "!=")
			s = Selector{Key: k, Value: v, Op: "!="}
		case strings.Contains(t, "="):
			k, v, _ := strings.Cut(t, "=")
			k = strings.TrimSuffix(k, "=") // accept "k==v"
			v = strings.TrimPrefix(v, "=")
			s = Selector{Key: k, Value: v, Op: "="}
		case strings.HasPrefix(t, "!"):
			s = Selector{Key: t[1:], Op: "!exists"}
		default:
			s = Selector{Key: t, Op: "exists"}
		}
		if !labelKeyRe.MatchString(s.Key) {
			return nil, invalid("label selector %q: bad key %q", t, s.Key)
		}
		out = append(out, s)
	}
	return out, nil
}

// Matches reports whether labels satisfy every selector.
func Matches(sel []Selector, labels map[string]string) bool {
	for _, s := range sel {
		v, ok := labels[s.Key]
		switch s.Op {
		case "=":
			if !ok || v != s.Value {
				return false
			}
		case "!=":
			if ok && v == s.Value {
				return false
			}
		case "exists":
			if !ok {
				return false
			}
		case "!exists":
			if ok {
				return false
			}
		}
	}
	return true
}
