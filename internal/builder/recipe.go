package builder

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
)

// cacheVersion is mixed into every cache key; bump it when what a step does
// changes (e.g. the apt-get command line), so old entries stop matching.
const cacheVersion = "sbx-build-v2"

// kind names a step's operation; it is also the step's name in recipes.
func kind(s *sbxv1.RecipeStep) string {
	switch s.GetStep().(type) {
	case *sbxv1.RecipeStep_AptInstall:
		return "apt_install"
	case *sbxv1.RecipeStep_PipInstall:
		return "pip_install"
	case *sbxv1.RecipeStep_NpmInstall:
		return "npm_install"
	case *sbxv1.RecipeStep_Run:
		return "run"
	case *sbxv1.RecipeStep_Copy:
		return "copy"
	case *sbxv1.RecipeStep_Env:
		return "env"
	case *sbxv1.RecipeStep_Workdir:
		return "workdir"
	case *sbxv1.RecipeStep_Entrypoint:
		return "entrypoint"
	case *sbxv1.RecipeStep_Cmd:
		return "cmd"
	case *sbxv1.RecipeStep_User:
		return "user"
	case *sbxv1.RecipeStep_Python:
		return "python"
	}
	return ""
}

// configOnly reports steps that change only the image config: they run no
// sandbox and add no layer.
func configOnly(s *sbxv1.RecipeStep) bool {
	switch kind(s) {
	case "env", "workdir", "entrypoint", "cmd", "user":
		return true
	}
	return false
}

// needsNetwork reports steps that download from package registries.
func needsNetwork(s *sbxv1.RecipeStep) bool {
	switch kind(s) {
	case "apt_install", "pip_install", "npm_install", "python":
		return true
	}
	return false
}

// pythonVersionRe accepts a python step's version: "3.11", "3.12", ...
var pythonVersionRe = regexp.MustCompile(`^3\.[0-9]{1,2}$`)

// packageRe accepts apt, pip and npm package specs ("python3-numpy",
// "numpy==2.0", "requests[socks]>=2", "@scope/pkg@1.2.3"). They are passed
// shell-quoted anyway; a leading "-" (an option) is refused.
var packageRe = regexp.MustCompile(`^[A-Za-z0-9@][A-Za-z0-9@/._+:=<>!~,\[\]*-]*$`)

var envKeyRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validate checks a recipe before anything runs.
func validate(r *sbxv1.Recipe) error {
	if r.GetFrom() == "" {
		return fmt.Errorf("recipe: `from` is missing: %w", errdefs.ErrInvalidArgument)
	}
	for i, s := range r.GetSteps() {
		if err := validateStep(s); err != nil {
			return fmt.Errorf("recipe step %d (%s): %v: %w", i+1, kind(s), err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func validateStep(s *sbxv1.RecipeStep) error {
	// The cache key encodes strings as JSON, which turns every invalid
	// UTF-8 sequence into U+FFFD: two different commands would share a
	// key (and one would reuse the other's cached layer).
	if !validUTF8(s) {
		return fmt.Errorf("not valid UTF-8")
	}
	switch st := s.GetStep().(type) {
	case nil:
		return fmt.Errorf("empty step")
	case *sbxv1.RecipeStep_AptInstall, *sbxv1.RecipeStep_PipInstall, *sbxv1.RecipeStep_NpmInstall:
		pkgs := packages(s)
		if len(pkgs) == 0 {
			return fmt.Errorf("no packages given")
		}
		for _, p := range pkgs {
			if !packageRe.MatchString(p) {
				return fmt.Errorf("package %q: not a package name", p)
			}
		}
	case *sbxv1.RecipeStep_Run:
		if strings.TrimSpace(st.Run) == "" || strings.ContainsRune(st.Run, 0) {
			return fmt.Errorf("empty command or NUL byte")
		}
	case *sbxv1.RecipeStep_Copy:
		if d := st.Copy.GetDest(); !path.IsAbs(d) || strings.ContainsRune(d, 0) {
			return fmt.Errorf("dest %q: must be an absolute path", d)
		}
	case *sbxv1.RecipeStep_Env:
		if len(st.Env.GetEnv()) == 0 {
			return fmt.Errorf("no variables given")
		}
		for k, v := range st.Env.GetEnv() {
			if !envKeyRe.MatchString(k) || strings.ContainsRune(v, 0) {
				return fmt.Errorf("variable %q: bad name or NUL in value", k)
			}
		}
	case *sbxv1.RecipeStep_Workdir:
		if !path.IsAbs(st.Workdir) || strings.ContainsRune(st.Workdir, 0) {
			return fmt.Errorf("%q: must be an absolute path", st.Workdir)
		}
	case *sbxv1.RecipeStep_User:
		if st.User == "" || strings.ContainsAny(st.User, "\x00\n") {
			return fmt.Errorf("empty user")
		}
	case *sbxv1.RecipeStep_Python:
		if !pythonVersionRe.MatchString(st.Python) {
			return fmt.Errorf("version %q: want MAJOR.MINOR, e.g. \"3.11\"", st.Python)
		}
	}
	return nil
}

// validUTF8 reports whether every string of s (a copy's tar aside) is
// valid UTF-8.
func validUTF8(s *sbxv1.RecipeStep) bool {
	strs := packages(s)
	switch st := s.GetStep().(type) {
	case *sbxv1.RecipeStep_Run:
		strs = append(strs, st.Run)
	case *sbxv1.RecipeStep_Copy:
		strs = append(strs, st.Copy.GetDest())
	case *sbxv1.RecipeStep_Env:
		for k, v := range st.Env.GetEnv() {
			strs = append(strs, k, v)
		}
	case *sbxv1.RecipeStep_Workdir:
		strs = append(strs, st.Workdir)
	case *sbxv1.RecipeStep_Entrypoint:
		strs = append(strs, st.Entrypoint.GetValues()...)
	case *sbxv1.RecipeStep_Cmd:
		strs = append(strs, st.Cmd.GetValues()...)
	case *sbxv1.RecipeStep_User:
		strs = append(strs, st.User)
	case *sbxv1.RecipeStep_Python:
		strs = append(strs, st.Python)
	}
	for _, v := range strs {
		if !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

func packages(s *sbxv1.RecipeStep) []string {
	switch st := s.GetStep().(type) {
	case *sbxv1.RecipeStep_AptInstall:
		return st.AptInstall.GetPackages()
	case *sbxv1.RecipeStep_PipInstall:
		return st.PipInstall.GetPackages()
	case *sbxv1.RecipeStep_NpmInstall:
		return st.NpmInstall.GetPackages()
	}
	return nil
}

// describe is a step's human-readable form, e.g. "RUN make install".
func describe(s *sbxv1.RecipeStep) string {
	var arg string
	switch st := s.GetStep().(type) {
	case *sbxv1.RecipeStep_Run:
		arg = st.Run
	case *sbxv1.RecipeStep_Copy:
		arg = fmt.Sprintf("(%d bytes of tar) %s", len(st.Copy.GetTar()), st.Copy.GetDest())
	case *sbxv1.RecipeStep_Env:
		for _, k := range slices.Sorted(maps.Keys(st.Env.GetEnv())) {
			arg += " " + k + "=" + st.Env.GetEnv()[k]
		}
		arg = strings.TrimSpace(arg)
	case *sbxv1.RecipeStep_Workdir:
		arg = st.Workdir
	case *sbxv1.RecipeStep_Entrypoint:
		arg = jsonList(st.Entrypoint.GetValues())
	case *sbxv1.RecipeStep_Cmd:
		arg = jsonList(st.Cmd.GetValues())
	case *sbxv1.RecipeStep_User:
		arg = st.User
	case *sbxv1.RecipeStep_Python:
		arg = st.Python
	default:
		arg = strings.Join(packages(s), " ")
	}
	if len(arg) > 200 {
		arg = arg[:200] + "..."
	}
	return strings.ToUpper(kind(s)) + " " + arg
}

func jsonList(v []string) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// canonical is the stable encoding of a step that its cache key hashes: a
// JSON object with the step's kind and arguments (env sorted, a copy's tar
// by the sha256 of its content, see tarContentSum).
func canonical(s *sbxv1.RecipeStep) string {
	type enc struct {
		Op   string   `json:"op"`
		Args []string `json:"args,omitempty"`
		Dest string   `json:"dest,omitempty"`
		Tar  string   `json:"tar_sha256,omitempty"`
	}
	e := enc{Op: kind(s)}
	switch st := s.GetStep().(type) {
	case *sbxv1.RecipeStep_Run:
		e.Args = []string{st.Run}
	case *sbxv1.RecipeStep_Copy:
		e.Dest, e.Tar = st.Copy.GetDest(), tarContentSum(st.Copy.GetTar())
	case *sbxv1.RecipeStep_Env:
		for _, k := range slices.Sorted(maps.Keys(st.Env.GetEnv())) {
			e.Args = append(e.Args, k+"="+st.Env.GetEnv()[k])
		}
	case *sbxv1.RecipeStep_Workdir:
		e.Args = []string{st.Workdir}
	case *sbxv1.RecipeStep_Entrypoint:
		e.Args = st.Entrypoint.GetValues()
	case *sbxv1.RecipeStep_Cmd:
		e.Args = st.Cmd.GetValues()
	case *sbxv1.RecipeStep_User:
		e.Args = []string{st.User}
	case *sbxv1.RecipeStep_Python:
		e.Args = []string{st.Python}
	default:
		e.Args = packages(s)
	}
	b, _ := json.Marshal(e)
	return string(b)
}

// stepKey is the cache key of a step: sha256 of the cache version, the
// digest of the image the step starts from (the base, or the previous
// step's image) and the step's canonical encoding. Keying on the parent
// image rather than the parent's key means a rerun step (cache pruned,
// --no-cache) invalidates every step after it. Cached steps recompose the
// same image digest, so an unchanged recipe keeps hitting.
func stepKey(parent string, s *sbxv1.RecipeStep) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s", cacheVersion, parent, canonical(s))
	return hex.EncodeToString(h.Sum(nil))
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// command is the shell command line a sandbox step runs.
func command(s *sbxv1.RecipeStep) string {
	var q []string
	for _, p := range packages(s) {
		q = append(q, shellQuote(p))
	}
	pkgs := strings.Join(q, " ")
	switch kind(s) {
	case "apt_install":
		// The lists stay (apt-get clean drops only downloaded .debs): a
		// later step or sandbox can apt-get install without an update.
		return "set -e; apt-get update; DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends " +
			pkgs + "; apt-get clean"
	case "python":
		v := s.GetPython() // validated: 3.N
		return "set -e; apt-get update; if ! apt-cache show python" + v + " >/dev/null 2>&1; then " +
			"echo \"python " + v + " is not packaged by this image's apt sources; they have: " +
			"$(apt-cache pkgnames python3. | grep -E '^python3\\.[0-9]+$' | sort -V | tr '\\n' ' ')\" >&2; exit 3; fi; " +
			"DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python" + v + " python" + v + "-venv python3-pip; " +
			"ln -sf /usr/bin/python" + v + " /usr/local/bin/python3; ln -sf /usr/bin/python" + v + " /usr/local/bin/python; apt-get clean"
	case "pip_install":
		// Debian's pip refuses system-wide installs (PEP 668) unless told.
		return "set -e; flag=; if python3 -m pip install --help 2>/dev/null | grep -q -- --break-system-packages; then " +
			"flag=--break-system-packages; fi; python3 -m pip install --no-cache-dir $flag " + pkgs
	case "npm_install":
		return "set -e; npm install -g " + pkgs + "; npm cache clean --force >/dev/null 2>&1 || true"
	case "run":
		return s.GetRun()
	}
	return ""
}

// applyConfig returns cfg changed by a config-only step.
func applyConfig(cfg image.ImageConfig, s *sbxv1.RecipeStep) image.ImageConfig {
	cfg.Env = slices.Clone(cfg.Env)
	switch st := s.GetStep().(type) {
	case *sbxv1.RecipeStep_Env:
		for _, k := range slices.Sorted(maps.Keys(st.Env.GetEnv())) {
			cfg.Env = slices.DeleteFunc(cfg.Env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") })
			cfg.Env = append(cfg.Env, k+"="+st.Env.GetEnv()[k])
		}
	case *sbxv1.RecipeStep_Workdir:
		cfg.WorkingDir = st.Workdir
	case *sbxv1.RecipeStep_Entrypoint:
		cfg.Entrypoint = slices.Clone(st.Entrypoint.GetValues())
	case *sbxv1.RecipeStep_Cmd:
		cfg.Cmd = slices.Clone(st.Cmd.GetValues())
	case *sbxv1.RecipeStep_User:
		cfg.User = st.User
	}
	return cfg
}

// tarContentSum hashes what a tar holds, not when it was made: each entry's
// name, type, mode, owner, link target and data, but no timestamps, so that
// a fresh checkout of unchanged files keeps hitting the cache (as docker's
// COPY does). A tar that does not parse is hashed whole.
func tarContentSum(data []byte) string {
	h := sha256.New()
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			sum := sha256.Sum256(data)
			return "raw:" + hex.EncodeToString(sum[:])
		}
		fmt.Fprintf(h, "%q %c %o %d %d %q %d\n", hdr.Name, hdr.Typeflag, hdr.Mode, hdr.Uid, hdr.Gid, hdr.Linkname, hdr.Size)
		if _, err := io.Copy(h, tr); err != nil {
			sum := sha256.Sum256(data)
			return "raw:" + hex.EncodeToString(sum[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
