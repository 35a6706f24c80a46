// Package tenant owns who may use the API: tenants read from a file (each
// with the hashes of its API tokens and its quotas), the Principal a
// request runs as, and how it travels in a context. It imports nothing of
// sbx but errdefs; internal/server authenticates with it and
// internal/sandbox scopes and bounds with it.
//
// Without a tenants file the daemon is single-user: requests carry no
// Principal and everything belongs to the unnamed owner "".
package tenant

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Quotas bound what one tenant holds at a time; 0 means unlimited.
type Quotas struct {
	// MaxSandboxes counts sandboxes not yet destroyed (children included).
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// MemoryBytes, CPUMillis and DiskBytes bound the sums of the
	// sandboxes' resource limits (as created, defaults applied).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
	// StorageBytes bounds images, volumes and codebases together.
	StorageBytes int64 `json:"storage_bytes,omitempty"`
}

// Tenant is one entry of the tenants file.
type Tenant struct {
	Name string `json:"name"`
	// Tokens are hashes of the tenant's API tokens ("sha256:<hex>"; make
	// them with `sbx tenant hash-token`). The file never holds a token.
	Tokens []string `json:"tokens"`
	Quotas Quotas   `json:"quotas"`
}

// File is the tenants file's format.
type File struct {
	Tenants []Tenant `json:"tenants"`
	// AdminTokens are hashes of the daemon's admin tokens (same form as a
	// tenant's). An admin token lists tenants and their usage; it is no
	// tenant and sees no tenant's sandboxes or stores.
	AdminTokens []string `json:"admin_tokens,omitempty"`
}

// Principal is who a request runs as.
type Principal struct {
	Tenant string
	Quotas Quotas
	// Scope, when set, is the id of the sandbox whose scoped token the
	// request carried: it sees and makes only that sandbox's children.
	Scope string
	// Only, when set, is the id of the sandbox whose E2B envd access token
	// the request carried: it sees that sandbox alone, observes nothing,
	// and may call only the RPCs E2B's envd and code interpreter are made
	// of (internal/server envdtoken.go).
	Only string
	// Admin is set for the daemon's admin token (Tenant is then "").
	Admin bool
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the Principal of ctx; without one (single-user mode,
// or the daemon's own work) it is the zero Principal: the owner "" with no
// quotas and no scope.
func FromContext(ctx context.Context) Principal {
	p, _ := ctx.Value(principalKey{}).(Principal)
	return p
}

var nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// hashPrefix is the only hash scheme of token hashes. API tokens are
// random and long (at least 16 characters, `sbx tenant hash-token` makes
// 256-bit ones), so a fast hash loses nothing to guessing; a slow one
// would cost every request.
const hashPrefix = "sha256:"

// HashToken returns the stored form of an API token.
func HashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// NewToken returns a fresh random API token.
func NewToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "sbx_" + hex.EncodeToString(b[:])
}

// Set is a parsed tenants file. It is immutable.
type Set struct {
	byHash  map[string]*Tenant
	admins  map[string]bool
	tenants []Tenant
}

// Parse reads a tenants file's contents; every mistake is named.
func Parse(b []byte) (*Set, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse tenants file: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	s := &Set{byHash: map[string]*Tenant{}, admins: map[string]bool{}, tenants: f.Tenants}
	if len(f.Tenants) == 0 {
		return nil, fmt.Errorf("tenants file lists no tenants: %w", errdefs.ErrInvalidArgument)
	}
	names := map[string]bool{}
	for i := range s.tenants {
		t := &s.tenants[i]
		if !nameRe.MatchString(t.Name) {
			return nil, fmt.Errorf("tenant %q: name must match %s: %w", t.Name, nameRe, errdefs.ErrInvalidArgument)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("tenant %q is listed twice: %w", t.Name, errdefs.ErrInvalidArgument)
		}
		names[t.Name] = true
		if len(t.Tokens) == 0 {
			return nil, fmt.Errorf("tenant %q has no tokens: %w", t.Name, errdefs.ErrInvalidArgument)
		}
		q := t.Quotas
		if q.MaxSandboxes < 0 || q.MemoryBytes < 0 || q.CPUMillis < 0 || q.DiskBytes < 0 || q.StorageBytes < 0 {
			return nil, fmt.Errorf("tenant %q: quotas must not be negative: %w", t.Name, errdefs.ErrInvalidArgument)
		}
		for _, h := range t.Tokens {
			key, err := parseHash(h, fmt.Sprintf("tenant %q", t.Name))
			if err != nil {
				return nil, err
			}
			if other, dup := s.byHash[key]; dup {
				return nil, fmt.Errorf("tenants %q and %q share a token: %w", other.Name, t.Name, errdefs.ErrInvalidArgument)
			}
			s.byHash[key] = t
		}
	}
	for _, h := range f.AdminTokens {
		key, err := parseHash(h, "admin_tokens")
		if err != nil {
			return nil, err
		}
		if t, dup := s.byHash[key]; dup {
			return nil, fmt.Errorf("admin_tokens: a token of tenant %q is also an admin token: %w", t.Name, errdefs.ErrInvalidArgument)
		}
		s.admins[key] = true
	}
	return s, nil
}

// parseHash checks a stored token hash and returns its canonical form.
func parseHash(h, where string) (string, error) {
	hexPart, ok := strings.CutPrefix(strings.ToLower(h), hashPrefix)
	if raw, err := hex.DecodeString(hexPart); !ok || err != nil || len(raw) != sha256.Size {
		return "", fmt.Errorf("%s: token %q is not a hash: want sha256:<64 hex digits> (make one with `sbx tenant hash-token`; the file must never hold a token itself): %w",
			where, abbreviate(h), errdefs.ErrInvalidArgument)
	}
	return hashPrefix + hexPart, nil
}

// abbreviate keeps an error message from repeating a whole secret someone
// put in the file by mistake.
func abbreviate(s string) string {
	if len(s) > 12 {
		return s[:12] + "..."
	}
	return s
}

// Load reads and parses a tenants file.
func Load(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tenants file: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Authenticate returns the Principal of a presented token. The lookup is
// by the token's hash, so its timing says nothing about stored tokens.
func (s *Set) Authenticate(tok string) (Principal, bool) {
	if tok == "" {
		return Principal{}, false
	}
	h := HashToken(tok)
	if s.admins[h] {
		return Principal{Admin: true}, true
	}
	t, ok := s.byHash[h]
	if !ok {
		return Principal{}, false
	}
	return Principal{Tenant: t.Name, Quotas: t.Quotas}, true
}

// Tenants returns the tenants in the file's order.
func (s *Set) Tenants() []Tenant { return s.tenants }

// Tenant returns a tenant by name.
func (s *Set) Tenant(name string) (Tenant, bool) {
	for _, t := range s.tenants {
		if t.Name == name {
			return t, true
		}
	}
	return Tenant{}, false
}

// Quotas returns a tenant's current quotas.
func (s *Set) Quotas(name string) (Quotas, bool) {
	t, ok := s.Tenant(name)
	return t.Quotas, ok
}

// Registry holds the current Set; Reload swaps it (on SIGHUP).
type Registry struct {
	path string
	cur  atomic.Pointer[Set]
}

// Open loads path into a new Registry.
func Open(path string) (*Registry, error) {
	s, err := Load(path)
	if err != nil {
		return nil, err
	}
	r := &Registry{path: path}
	r.cur.Store(s)
	return r, nil
}

// NewRegistry wraps a parsed Set (tests).
func NewRegistry(s *Set) *Registry {
	r := &Registry{}
	r.cur.Store(s)
	return r
}

// Reload re-reads the file; on error the old tenants stay in force.
func (r *Registry) Reload() error {
	if r.path == "" {
		return nil
	}
	s, err := Load(r.path)
	if err != nil {
		return err
	}
	r.cur.Store(s)
	return nil
}

// Current returns the Set in force.
func (r *Registry) Current() *Set { return r.cur.Load() }

// ValidName reports whether s is a tenant name (safe as a directory name).
func ValidName(s string) bool { return nameRe.MatchString(s) }
