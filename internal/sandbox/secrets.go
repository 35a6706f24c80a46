package sandbox

import (
	"fmt"
	"net/textproto"
	"path"
	"slices"
	"strings"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/network"
	"github.com/sbxdev/sbx/internal/runtime"
)

// Domain secrets: the box's env holds a placeholder (network.Manager's
// Placeholder: stable per sandbox and name, unguessable), and the egress
// proxy puts the value in its place in HTTPS requests to the secret's
// domains, in the headers the secret names (Authorization by default) and,
// if it opts in, the query; never over plain HTTP.
// For HTTPS to those domains the proxy terminates TLS with the daemon's CA,
// so boxes with domain secrets get a CA bundle (the host's roots plus that
// CA) mounted read-only at caBundleDir and the usual variables pointing at it.

// caBundleDir is where the CA bundle directory is mounted in boxes with
// domain secrets; caBundlePath the bundle itself.
const (
	caBundleDir  = "/etc/sbx"
	caBundlePath = caBundleDir + "/ca-bundle.crt"
)

// caBundleEnv are the variables common TLS stacks read a CA file from.
var caBundleEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"}

// maxDomainSecrets bounds a request (each one costs work per request);
// maxSecretHeaders the headers one secret may name.
const (
	maxDomainSecrets = 64
	maxSecretHeaders = 16
)

// unsubstitutableHeaders are headers a domain secret may not name: the
// proxy drops or rewrites them (hop-by-hop, framing, Host), so a value put
// there would go nowhere or somewhere unexpected.
var unsubstitutableHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Host": true, "Content-Length": true,
}

// isHeaderName reports whether h is an HTTP field name (RFC 9110 token).
func isHeaderName(h string) bool {
	if h == "" || len(h) > 256 {
		return false
	}
	for _, c := range []byte(h) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// validateSecretHeaders checks the header names of domain secret name.
func validateSecretHeaders(name string, headers []string) error {
	if len(headers) > maxSecretHeaders {
		return invalid("domain secret %q: %d headers given, at most %d", name, len(headers), maxSecretHeaders)
	}
	for _, h := range headers {
		if !isHeaderName(h) {
			return invalid("domain secret %q: header %q is not a valid HTTP header name", name, h)
		}
		if unsubstitutableHeaders[textproto.CanonicalMIMEHeaderKey(h)] {
			return invalid("domain secret %q: header %q cannot carry a secret (the proxy drops or rewrites it)", name, h)
		}
	}
	return nil
}

// validateDomainSecrets checks the domain secrets of a create request.
func validateDomainSecrets(req *sbxv1.CreateSandboxRequest) error {
	ds := req.GetDomainSecrets()
	if len(ds) > maxDomainSecrets {
		return invalid("domain_secrets: %d given, at most %d", len(ds), maxDomainSecrets)
	}
	seen := map[string]bool{}
	for i, s := range ds {
		name := s.GetName()
		switch {
		case name == "":
			return invalid("domain_secrets[%d]: no name", i)
		case !envKeyRe.MatchString(name):
			return invalid("domain secret name %q: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", name)
		case seen[name]:
			return invalid("domain secret %q: given twice", name)
		case s.GetValue() == "":
			return invalid("domain secret %q: empty value", name)
		case len(s.GetDomains()) == 0:
			return invalid("domain secret %q: no domains (the hosts its value may be sent to)", name)
		}
		if isCABundleVar(name) {
			return invalid("domain secret %q: name is reserved for the CA bundle", name)
		}
		if _, dup := req.GetEnv()[name]; dup {
			return invalid("%q is given both as env and as a domain secret", name)
		}
		if _, dup := req.GetSecrets()[name]; dup {
			return invalid("%q is given both as a secret and as a domain secret", name)
		}
		for _, c := range s.GetValue() {
			if c == 0 || c == '\r' || c == '\n' {
				return invalid("domain secret %q: value contains a NUL or line break (it goes into HTTP headers)", name)
			}
		}
		for _, d := range s.GetDomains() {
			if _, err := network.NormalizeDomain(d); err != nil {
				return invalid("domain secret %q: domain %q: want a host name or *.suffix", name, d)
			}
		}
		if err := validateSecretHeaders(name, s.GetHeaders()); err != nil {
			return err
		}
		seen[name] = true
	}
	return nil
}

func isCABundleVar(name string) bool {
	for _, v := range caBundleEnv {
		if v == name {
			return true
		}
	}
	return false
}

// domainSecrets turns a spec's domain secrets into the proxy's form, with
// the sandbox's placeholders.
func (m *Manager) domainSecrets(id string, spec *sbxv1.CreateSandboxRequest) []network.Secret {
	if m.cfg.Network == nil || len(spec.GetDomainSecrets()) == 0 {
		return nil
	}
	out := make([]network.Secret, 0, len(spec.GetDomainSecrets()))
	for _, s := range spec.GetDomainSecrets() {
		var domains []string
		for _, d := range s.GetDomains() {
			n, _ := network.NormalizeDomain(d) // validated at create
			domains = append(domains, n)
		}
		var headers []string
		for _, h := range s.GetHeaders() {
			if h = textproto.CanonicalMIMEHeaderKey(h); !slices.Contains(headers, h) {
				headers = append(headers, h)
			}
		}
		out = append(out, network.Secret{Name: s.GetName(), Placeholder: m.cfg.Network.Placeholder(id, s.GetName()),
			Value: s.GetValue(), Domains: domains, Headers: headers, AllowQuery: s.GetAllowQuery()})
	}
	return out
}

// withSecrets returns pol carrying the sandbox's domain secrets.
func (m *Manager) withSecrets(id string, spec *sbxv1.CreateSandboxRequest, pol network.Policy) network.Policy {
	pol.Secrets = m.domainSecrets(id, spec)
	return pol
}

// addDomainSecrets puts the placeholders and the CA bundle into a box's
// runtime spec.
func (m *Manager) addDomainSecrets(rs *runtime.Spec, spec *sbxv1.CreateSandboxRequest, secrets []network.Secret) error {
	if len(secrets) == 0 {
		return nil
	}
	dir := m.cfg.Network.CABundleDir()
	if dir == "" {
		return fmt.Errorf("domain secrets: no CA bundle: %w", errdefs.ErrFailedPrecondition)
	}
	for _, s := range secrets {
		rs.Env = append(rs.Env, s.Name+"="+s.Placeholder)
	}
	for _, v := range caBundleEnv {
		if _, set := spec.GetEnv()[v]; !set { // the user's own choice wins
			rs.Env = append(rs.Env, v+"="+caBundlePath)
		}
	}
	rs.Mounts = append(rs.Mounts, runtime.Mount{Files: &runtime.FilesMount{Dir: dir}, Destination: path.Clean(caBundleDir), ReadOnly: true})
	return nil
}

// domainSecretsProto is the API view: names, domains, headers and the
// query opt-in, never values.
func domainSecretsProto(spec *sbxv1.CreateSandboxRequest) []*sbxv1.DomainSecret {
	var out []*sbxv1.DomainSecret
	for _, s := range spec.GetDomainSecrets() {
		out = append(out, &sbxv1.DomainSecret{Name: s.GetName(), Domains: s.GetDomains(), Headers: s.GetHeaders(), AllowQuery: s.GetAllowQuery()})
	}
	return out
}
