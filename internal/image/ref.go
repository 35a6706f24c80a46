package image

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Image references come from users, from recipes and from archives (a
// docker-save manifest's RepoTags, an OCI layout's annotations): all of
// them are checked against the grammar of the distribution spec before
// anything uses them. go-containerregistry's parser alone is too lax for
// names an attacker chose: it takes "../../evil:1" as registry ".." and
// repository "../evil", and "x/../y" as a repository.

// maxRefLen bounds a whole reference: a 255-byte name (the distribution
// spec's limit), a 128-byte tag and a digest fit.
const maxRefLen = 255 + 1 + 128 + 1 + 7 + 64

// checkRef validates ref against the reference grammar of the distribution
// spec (docker/distribution's reference package):
//
//	reference  := name [ ":" tag ] [ "@" digest ]
//	name       := [domain "/"] path-component ("/" path-component)*
//	domain     := host-component ("." host-component)* [":" port]
//	host-component := [A-Za-z0-9] | [A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]
//	path-component := [a-z0-9]+ (("." | "_" | "__" | "-"+) [a-z0-9]+)*
//	tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//	digest     := "sha256:" 64 lowercase hex
//
// The first component is a domain when it has a "." or ":" or is
// "localhost", as docker decides. The name is at most 255 bytes. Errors
// wrap errdefs.ErrInvalidArgument and quote the reference.
func checkRef(ref string) error {
	bad := func(why string) error {
		return fmt.Errorf("image reference %s: %s: %w", quoteRef(ref), why, errdefs.ErrInvalidArgument)
	}
	switch {
	case ref == "":
		return bad("empty")
	case len(ref) > maxRefLen:
		return bad(fmt.Sprintf("%d bytes, more than %d", len(ref), maxRefLen))
	}
	rest := ref
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		if err := validDigest(rest[i+1:]); err != nil {
			return bad("digest is not sha256:<64 lowercase hex>")
		}
		rest = rest[:i]
	}
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && !strings.Contains(rest[i+1:], "/") {
		if !validTag(rest[i+1:]) {
			return bad(fmt.Sprintf("tag %s is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", quoteRef(rest[i+1:])))
		}
		rest = rest[:i]
	}
	if rest == "" {
		return bad("no repository name")
	}
	if len(rest) > 255 {
		return bad(fmt.Sprintf("name is %d bytes, more than 255", len(rest)))
	}
	comps := strings.Split(rest, "/")
	if len(comps) > 1 && (strings.ContainsAny(comps[0], ".:") || comps[0] == "localhost") {
		if !validDomain(comps[0]) {
			return bad(fmt.Sprintf("registry %s is not a host name with an optional port", quoteRef(comps[0])))
		}
		comps = comps[1:]
	}
	for _, c := range comps {
		if !validPathComponent(c) {
			return bad(fmt.Sprintf("repository component %s is not lowercase letters and digits separated by '.', '_', '__' or '-'", quoteRef(c)))
		}
	}
	return nil
}

// quoteRef quotes a name for an error message, cut to 80 bytes: it may be
// hostile (control characters, megabytes).
func quoteRef(s string) string {
	if len(s) > 80 {
		return strconv.Quote(s[:80]) + "..."
	}
	return strconv.Quote(s)
}

func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

func isAlnum(c byte) bool { return isLowerAlnum(c) || 'A' <= c && c <= 'Z' }

func validTag(t string) bool {
	if t == "" || len(t) > 128 || !(isAlnum(t[0]) || t[0] == '_') {
		return false
	}
	for i := 1; i < len(t); i++ {
		if c := t[i]; !isAlnum(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func validPathComponent(c string) bool {
	if c == "" || !isLowerAlnum(c[0]) || !isLowerAlnum(c[len(c)-1]) {
		return false
	}
	for i := 1; i < len(c); i++ {
		if isLowerAlnum(c[i]) {
			continue
		}
		// A separator: ".", "_", "__" or a run of "-", between alphanumerics.
		j := i
		switch c[i] {
		case '.':
			j = i + 1
		case '_':
			j = i + 1
			if j < len(c) && c[j] == '_' {
				j++
			}
		case '-':
			for j < len(c) && c[j] == '-' {
				j++
			}
		default:
			return false
		}
		if j >= len(c) || !isLowerAlnum(c[j]) {
			return false
		}
		i = j
	}
	return true
}

func validDomain(d string) bool {
	host := d
	if i := strings.LastIndexByte(d, ':'); i >= 0 {
		port := d[i+1:]
		if port == "" || len(port) > 5 {
			return false
		}
		for j := 0; j < len(port); j++ {
			if port[j] < '0' || port[j] > '9' {
				return false
			}
		}
		host = d[:i]
	}
	if host == "" {
		return false
	}
	for _, h := range strings.Split(host, ".") {
		if h == "" || !isAlnum(h[0]) || !isAlnum(h[len(h)-1]) {
			return false
		}
		for j := 0; j < len(h); j++ {
			if c := h[j]; !isAlnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}

// parseRef checks ref (see checkRef) and parses it.
func parseRef(ref string, opts ...name.Option) (name.Reference, error) {
	if err := checkRef(ref); err != nil {
		return nil, err
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("parse image reference %s: %v: %w", quoteRef(ref), err, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// normalizeTag checks that ref names a tag (not a digest) and returns its
// canonical form; this is what every tag the store records goes through.
func normalizeTag(ref string) (string, error) {
	r, err := parseRef(ref)
	if err != nil {
		return "", err
	}
	if _, ok := r.(name.Tag); !ok {
		return "", fmt.Errorf("image reference %s: a tag is needed, not a digest: %w", quoteRef(ref), errdefs.ErrInvalidArgument)
	}
	return r.Name(), nil
}
