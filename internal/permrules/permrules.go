// Package permrules owns path permission rules: compiling a PathPolicy
// (preset + rules + default) into a Policy, validating it with errors that
// name what is wrong, and deciding the permission of a path below the guarded
// directory. It is pure (standard library and the api module only): the
// daemon uses it to validate requests, the agent to enforce them (see
// internal/agent/permfs).
//
// # Semantics
//
// Paths are relative to the guarded directory's root and written "/a/b"
// ("/" is the root). A rule matches a path when it matches the path itself
// or one of its ancestors, so a directory's permission is inherited by
// everything below it unless another rule wins:
//
//   - FILE "/config/prod.yaml": exactly that path (a leading "/" is optional;
//     no wildcards, no inheritance).
//   - DIRECTORY "/output" or "secrets": the directory and everything below.
//     Without "/" the name matches at any depth. Components may use
//     path.Match wildcards.
//   - GLOB (gitignore-like): without "/" ("*.pem", ".env*") it matches a base
//     name at any depth; with "/" it is anchored at the root ("/output/**",
//     "src/*.go"); "**" as a whole component matches zero or more components.
//     A trailing "/" is ignored.
//
// A case-insensitive rule (PermissionRule.case_insensitive) compares its
// pattern and the path after Unicode simple case folding, so "*.pem" also
// matches "KEY.PEM" (a character range folds by its ends: use [a-z], not
// [Z-a]). The presets' hiding rules are all case-insensitive.
//
// The winner among matching rules is the one with the highest priority, then
// the most specific type (file over directory over glob), then the longest
// pattern, then the later rule (user rules come after the preset's). No
// matching rule gives the policy's default.
//
// Hidden directories hide their subtree: a path below a directory whose
// permission is NONE is NONE too unless the path's own winning rule has a
// strictly higher priority than the one hiding the directory. A hidden
// directory through which such a higher-priority rule may expose something
// is shown as VIEW (traversable and listable, listing only what is visible).
// The root of a guard is never less than VIEW.
package permrules

import (
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Perm is a permission, ordered: None < View < Read < Write.
type Perm int8

// The permissions, numbered as sbx.v1.Permission.
const (
	None  Perm = Perm(sbxv1.Permission_PERMISSION_NONE)
	View  Perm = Perm(sbxv1.Permission_PERMISSION_VIEW)
	Read  Perm = Perm(sbxv1.Permission_PERMISSION_READ)
	Write Perm = Perm(sbxv1.Permission_PERMISSION_WRITE)
)

func (p Perm) String() string {
	switch p {
	case None:
		return "none"
	case View:
		return "view"
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Perm(%d)", int8(p))
}

// ParsePerm parses "none", "view", "read" or "write".
func ParsePerm(s string) (Perm, error) {
	for _, p := range []Perm{None, View, Read, Write} {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown permission %q (want none, view, read or write)", s)
}

// ParseType parses "glob", "directory" ("dir") or "file".
func ParseType(s string) (sbxv1.PatternType, error) {
	switch strings.ToLower(s) {
	case "", "glob":
		return sbxv1.PatternType_PATTERN_TYPE_GLOB, nil
	case "dir", "directory":
		return sbxv1.PatternType_PATTERN_TYPE_DIRECTORY, nil
	case "file":
		return sbxv1.PatternType_PATTERN_TYPE_FILE, nil
	}
	return 0, fmt.Errorf("unknown pattern type %q (want glob, directory or file)", s)
}

// Limits on a request's size.
const (
	MaxRules      = 256
	MaxPatternLen = 1024
	MaxPolicies   = 16
)

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("invalid path policy")

// rule is a compiled PermissionRule.
type rule struct {
	pattern  string
	typ      sbxv1.PatternType
	perm     Perm
	priority int64
	// comps are the pattern's components (case-folded if fold); anchored is
	// false for a single-component glob or directory pattern without "/",
	// which matches a name at any depth.
	comps    []string
	anchored bool
	// fold: match against the case-folded path (see foldCase).
	fold bool
	// idx is the rule's place in its policy (the last tie-break).
	idx int
	// name matches one component for an unanchored rule.
	name nameMatcher
}

// nameMatcher matches a path component against one pattern component,
// without path.Match for the common shapes ("x", "*x", "x*").
type nameMatcher struct {
	kind byte // '=' literal, '>' suffix ("*x"), '<' prefix ("x*"), 'm' path.Match
	s    string
}

func newNameMatcher(pat string) nameMatcher {
	const meta = `*?[\`
	switch {
	case !strings.ContainsAny(pat, meta):
		return nameMatcher{'=', pat}
	case len(pat) > 1 && pat[0] == '*' && !strings.ContainsAny(pat[1:], meta):
		return nameMatcher{'>', pat[1:]}
	case len(pat) > 1 && pat[len(pat)-1] == '*' && !strings.ContainsAny(pat[:len(pat)-1], meta):
		return nameMatcher{'<', pat[:len(pat)-1]}
	}
	return nameMatcher{'m', pat}
}

func (m nameMatcher) match(c string) bool {
	switch m.kind {
	case '=':
		return c == m.s
	case '>':
		return strings.HasSuffix(c, m.s)
	case '<':
		return strings.HasPrefix(c, m.s)
	}
	ok, _ := path.Match(m.s, c)
	return ok
}

// rank orders rules for precedence: higher wins.
func (r *rule) rank() (int64, int, int) {
	t := 1
	switch r.typ {
	case sbxv1.PatternType_PATTERN_TYPE_DIRECTORY:
		t = 2
	case sbxv1.PatternType_PATTERN_TYPE_FILE:
		t = 3
	}
	return r.priority, t, len(r.pattern)
}

// beats reports whether r wins over o (o may be nil). A full tie goes to
// the later rule.
func (r *rule) beats(o *rule) bool {
	if o == nil {
		return true
	}
	a1, a2, a3 := r.rank()
	b1, b2, b3 := o.rank()
	if a1 != b1 {
		return a1 > b1
	}
	if a2 != b2 {
		return a2 > b2
	}
	if a3 != b3 {
		return a3 > b3
	}
	return r.idx > o.idx
}

// Policy is a compiled PathPolicy.
type Policy struct {
	// Path is the guarded directory (absolute, clean).
	Path string
	// Default is the permission of paths no rule matches.
	Default Perm
	rules   []*rule
	// fold: some rule is case-insensitive.
	fold bool
	// loose are the unanchored rules (a name at any depth), anchored the
	// others; both in rule order.
	loose, anchored []*rule
}

// defaultPriority is below every rule's.
const defaultPriority = math.MinInt64

// Compile validates p and compiles it. Errors wrap ErrInvalid and name the
// offending field.
func Compile(p *sbxv1.PathPolicy) (*Policy, error) {
	dir, err := CheckGuardPath(p.GetPath())
	if err != nil {
		return nil, err
	}
	out := &Policy{Path: dir, Default: Write}
	var base []*sbxv1.PermissionRule
	if name := p.GetPreset(); name != "" {
		ps, ok := presets[name]
		if !ok {
			return nil, fmt.Errorf("%w: guard %s: unknown preset %q (want one of %s)", ErrInvalid, dir, name, strings.Join(PresetNames(), ", "))
		}
		out.Default = ps.def
		base = ps.rules
	}
	if d := p.GetDefaultPermission(); d != sbxv1.Permission_PERMISSION_UNSPECIFIED {
		if d < sbxv1.Permission_PERMISSION_NONE || d > sbxv1.Permission_PERMISSION_WRITE {
			return nil, fmt.Errorf("%w: guard %s: unknown default permission %d", ErrInvalid, dir, d)
		}
		out.Default = Perm(d)
	}
	if len(p.GetRules()) > MaxRules {
		return nil, fmt.Errorf("%w: guard %s: %d rules (at most %d)", ErrInvalid, dir, len(p.GetRules()), MaxRules)
	}
	for _, pr := range base {
		r, err := compileRule(pr)
		if err != nil {
			panic(fmt.Sprintf("preset rule %v: %v", pr, err)) // presets are ours
		}
		out.rules = append(out.rules, r)
	}
	for i, pr := range p.GetRules() {
		r, err := compileRule(pr)
		if err != nil {
			return nil, fmt.Errorf("%w: guard %s: rule %d (%q): %v", ErrInvalid, dir, i+1, pr.GetPattern(), err)
		}
		// A user rule with the same pattern and type replaces the preset's.
		out.rules = slices.DeleteFunc(out.rules, func(o *rule) bool {
			return o.pattern == r.pattern && o.typ == r.typ
		})
		out.rules = append(out.rules, r)
	}
	for i, r := range out.rules {
		r.idx = i
		out.fold = out.fold || r.fold
		if r.anchored {
			out.anchored = append(out.anchored, r)
		} else {
			r.name = newNameMatcher(r.comps[0])
			out.loose = append(out.loose, r)
		}
	}
	return out, nil
}

// forbiddenGuards are directories (and everything below them) that cannot be
// guarded: the kernel's and the agent's own.
var forbiddenGuards = []string{"/proc", "/sys", "/dev", "/.sbx"}

// CheckGuardPath validates a guarded directory and returns it cleaned.
func CheckGuardPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%w: guard path is empty", ErrInvalid)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%w: guard path %q contains a NUL byte", ErrInvalid, p)
	case !strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("%w: guard path %q is relative (want an absolute path)", ErrInvalid, p)
	case len(p) > 4096:
		return "", fmt.Errorf("%w: guard path is too long", ErrInvalid)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: guard path %q contains \"..\"", ErrInvalid, p)
		}
	}
	clean := path.Clean(p)
	if clean == "/" {
		return "", fmt.Errorf("%w: cannot guard / (guard a directory such as /workspace)", ErrInvalid)
	}
	for _, f := range forbiddenGuards {
		if clean == f || strings.HasPrefix(clean, f+"/") {
			return "", fmt.Errorf("%w: cannot guard %s (inside %s)", ErrInvalid, clean, f)
		}
	}
	return clean, nil
}

// CheckPolicies compiles every policy and checks that no two guard the same
// or nested directories.
func CheckPolicies(ps []*sbxv1.PathPolicy) ([]*Policy, error) {
	if len(ps) > MaxPolicies {
		return nil, fmt.Errorf("%w: %d path policies (at most %d)", ErrInvalid, len(ps), MaxPolicies)
	}
	out := make([]*Policy, 0, len(ps))
	for _, p := range ps {
		c, err := Compile(p)
		if err != nil {
			return nil, err
		}
		for _, o := range out {
			if o.Path == c.Path || strings.HasPrefix(c.Path, o.Path+"/") || strings.HasPrefix(o.Path, c.Path+"/") {
				return nil, fmt.Errorf("%w: guards %s and %s overlap (guard each directory once, not nested)", ErrInvalid, o.Path, c.Path)
			}
		}
		out = append(out, c)
	}
	return out, nil
}

func compileRule(pr *sbxv1.PermissionRule) (*rule, error) {
	pat := pr.GetPattern()
	switch {
	case pat == "":
		return nil, errors.New("empty pattern")
	case len(pat) > MaxPatternLen:
		return nil, fmt.Errorf("pattern longer than %d bytes", MaxPatternLen)
	case strings.ContainsRune(pat, 0):
		return nil, errors.New("pattern contains a NUL byte")
	}
	perm := pr.GetPermission()
	if perm == sbxv1.Permission_PERMISSION_UNSPECIFIED {
		return nil, errors.New("permission is required (none, view, read or write)")
	}
	if perm < sbxv1.Permission_PERMISSION_NONE || perm > sbxv1.Permission_PERMISSION_WRITE {
		return nil, fmt.Errorf("unknown permission %d", perm)
	}
	typ := pr.GetType()
	if typ == sbxv1.PatternType_PATTERN_TYPE_UNSPECIFIED {
		typ = sbxv1.PatternType_PATTERN_TYPE_GLOB
	}
	if typ < sbxv1.PatternType_PATTERN_TYPE_GLOB || typ > sbxv1.PatternType_PATTERN_TYPE_FILE {
		return nil, fmt.Errorf("unknown pattern type %d", typ)
	}
	r := &rule{pattern: pat, typ: typ, perm: Perm(perm), priority: int64(pr.GetPriority()), fold: pr.GetCaseInsensitive()}
	trimmed := strings.Trim(pat, "/")
	r.anchored = strings.Contains(trimmed, "/") || strings.HasPrefix(pat, "/") || typ == sbxv1.PatternType_PATTERN_TYPE_FILE
	if trimmed == "" {
		if typ != sbxv1.PatternType_PATTERN_TYPE_DIRECTORY {
			return nil, errors.New("pattern names the root; use a directory rule \"/\" or the default permission")
		}
		r.anchored = true
		return r, nil
	}
	for _, c := range strings.Split(trimmed, "/") {
		switch {
		case c == "":
			return nil, errors.New("pattern has an empty component (\"//\")")
		case c == "." || c == "..":
			return nil, fmt.Errorf("pattern has a %q component", c)
		case typ == sbxv1.PatternType_PATTERN_TYPE_FILE:
		case c == "**":
			if typ != sbxv1.PatternType_PATTERN_TYPE_GLOB {
				return nil, errors.New("\"**\" is only allowed in glob patterns")
			}
		case strings.Contains(c, "**"):
			return nil, errors.New("\"**\" must be a whole path component")
		default:
			if _, err := path.Match(c, ""); err != nil {
				return nil, fmt.Errorf("bad pattern: %v", err)
			}
		}
		if r.fold {
			c = foldCase(c)
		}
		r.comps = append(r.comps, c)
	}
	return r, nil
}

// splitPath turns "/a/b" (or "a/b") into its components; "/" is none.
func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// foldCase maps every rune of s to the smallest rune of its Unicode simple
// case folding orbit, so that two strings fold to the same one exactly when
// strings.EqualFold says they are equal ("key.PEM", "KEY.pem" and "KEY.PEM"
// all fold to "KEY.PEM"; "ſ" (long s) folds like "s"). path.Match's
// metacharacters have no case and are kept.
func foldCase(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToUpper(s)
	}
	return strings.Map(func(r rune) rune {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		return m
	}, s)
}

// pathComps is a path's components and, if the policy has a
// case-insensitive rule, their case-folded form.
type pathComps struct {
	raw, folded []string
}

func (p *Policy) pathComps(rel string) pathComps {
	pc := pathComps{raw: splitPath(rel)}
	if p.fold {
		pc.folded = make([]string, len(pc.raw))
		for i, c := range pc.raw {
			pc.folded[i] = foldCase(c)
		}
	}
	return pc
}

// prefix is the path of the first k components.
func (pc pathComps) prefix(k int) pathComps {
	out := pathComps{raw: pc.raw[:k]}
	if pc.folded != nil {
		out.folded = pc.folded[:k]
	}
	return out
}

// of returns the components r matches against.
func (pc pathComps) of(r *rule) []string {
	if r.fold {
		return pc.folded
	}
	return pc.raw
}

// matches reports whether r matches the path pc or one of its ancestors.
func (r *rule) matches(pc pathComps) bool {
	comps := pc.of(r)
	switch {
	case r.typ == sbxv1.PatternType_PATTERN_TYPE_FILE:
		return slices.Equal(r.comps, comps)
	case !r.anchored:
		return slices.ContainsFunc(comps, r.name.match)
	case len(r.comps) == 0: // directory "/"
		return true
	}
	for k := 1; k <= len(comps); k++ {
		if matchComps(r.comps, comps[:k]) {
			return true
		}
	}
	return false
}

// matchComps matches pattern components (with "**") against path components.
func matchComps(pat, p []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(p); i++ {
				if matchComps(pat[1:], p[i:]) {
					return true
				}
			}
			return false
		}
		if len(p) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], p[0]); !ok {
			return false
		}
		pat, p = pat[1:], p[1:]
	}
	return len(p) == 0
}

// mayMatchBelow reports whether r could match a path strictly below pc.
func (r *rule) mayMatchBelow(pc pathComps) bool {
	if !r.anchored || len(r.comps) == 0 {
		return true
	}
	return couldExtend(r.comps, pc.of(r))
}

// couldExtend reports whether pat matches some path that is p plus at least
// one more component.
func couldExtend(pat, p []string) bool {
	if len(p) == 0 {
		return len(pat) > 0
	}
	if len(pat) == 0 {
		return false
	}
	if pat[0] == "**" {
		return couldExtend(pat[1:], p) || couldExtend(pat, p[1:])
	}
	if ok, _ := path.Match(pat[0], p[0]); !ok && pat[0] != p[0] {
		return false
	}
	return couldExtend(pat[1:], p[1:])
}

// winner returns the winning rule for pc, or nil for the default.
func (p *Policy) winner(pc pathComps) *rule {
	var w *rule
	for _, r := range p.rules {
		if r.matches(pc) && r.beats(w) {
			w = r
		}
	}
	return w
}

func (p *Policy) permOf(w *rule) (Perm, int64) {
	if w == nil {
		return p.Default, defaultPriority
	}
	return w.perm, w.priority
}

// effective is the permission of pc after hidden ancestors are applied,
// and the priority that decided it. It finds the winner of every prefix
// of pc in one pass: an unanchored rule matches a prefix when it matches
// one of its components, so the best of those only grows with the prefix.
func (p *Policy) effective(pc pathComps) (Perm, int64) {
	n := len(pc.raw)
	if n == 0 {
		return p.permOf(p.winner(pc))
	}
	var buf [16]*rule
	wins := buf[:0]
	var loose *rule // best unanchored rule matching a component so far
	for k := 1; k <= n; k++ {
		for _, r := range p.loose {
			if r.beats(loose) && r.name.match(pc.of(r)[k-1]) {
				loose = r
			}
		}
		w, pre := loose, pc.prefix(k)
		for _, r := range p.anchored {
			if r.beats(w) && r.matches(pre) {
				w = r
			}
		}
		wins = append(wins, w)
	}
	perm, prio := p.permOf(wins[n-1])
	for _, w := range wins[:n-1] {
		aperm, aprio := p.permOf(w)
		if aperm == None && aprio >= prio {
			return None, aprio
		}
	}
	return perm, prio
}

// Decide returns the permission of rel ("/a/b", relative to the guarded
// directory's root); isDir says whether it is a directory (a hidden
// directory may be shown as View, see the package doc).
func (p *Policy) Decide(rel string, isDir bool) Perm {
	pc := p.pathComps(rel)
	perm, prio := p.effective(pc)
	if perm != None || !isDir {
		if len(pc.raw) == 0 && perm < View {
			return View
		}
		return perm
	}
	for _, r := range p.rules {
		if r.perm != None && r.priority > prio && r.mayMatchBelow(pc) {
			return View
		}
	}
	if len(pc.raw) == 0 {
		return View
	}
	return None
}
