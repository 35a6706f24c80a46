package network

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Files of the egress dir.
const (
	caCertFile      = "ca.pem"
	caKeyFile       = "ca-key.pem"
	placeholderKey  = "placeholder.key"
	bundleDir       = "bundle"
	bundleFile      = "ca-bundle.crt"
	leafValidity    = 7 * 24 * time.Hour
	leafCacheMax    = 4096
	placeholderTail = 24 // hex digits of the HMAC in a placeholder
)

// hostBundles are where distributions keep their CA bundle.
var hostBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/ca-bundle.pem",             // openSUSE
	"/etc/ssl/cert.pem",
}

// egressCA is the daemon's interception CA: generated once into the egress
// dir, it signs a certificate per host name the proxy intercepts (hosts of
// domain secrets only). Boxes with secrets trust it through the bundle.
type egressCA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // one key for every leaf: minting stays cheap
	phKey   []byte            // HMAC key of placeholders

	mu sync.Mutex
	// leaves caches minted certificates by host name; guarded by mu.
	leaves map[string]*tls.Certificate
}

// loadCA loads the CA of dir or makes one (key 0600).
func loadCA(dir string) (*egressCA, error) {
	// 0711: boxes' user namespaces traverse it to the bundle they mount;
	// the key files are 0600.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("create egress dir: %w", err)
	}
	ca := &egressCA{leaves: map[string]*tls.Certificate{}}
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil {
		if err := ca.parse(certPEM, keyPEM); err != nil {
			return nil, fmt.Errorf("load egress CA from %s: %w", dir, err)
		}
	} else {
		if !errors.Is(cerr, os.ErrNotExist) && cerr != nil || !errors.Is(kerr, os.ErrNotExist) && kerr != nil {
			return nil, fmt.Errorf("read egress CA: %w", errors.Join(cerr, kerr))
		}
		var err error
		if certPEM, keyPEM, err = newCA(); err != nil {
			return nil, err
		}
		if err := ca.parse(certPEM, keyPEM); err != nil {
			return nil, err
		}
		// Key first: a cert without its key is useless, the reverse is redone.
		if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
			return nil, err
		}
		if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
			return nil, err
		}
	}
	phPath := filepath.Join(dir, placeholderKey)
	ph, err := os.ReadFile(phPath)
	if errors.Is(err, os.ErrNotExist) {
		ph = make([]byte, 32)
		_, _ = rand.Read(ph)
		err = writeFileAtomic(phPath, ph, 0o600)
	}
	if err != nil || len(ph) < 16 {
		return nil, fmt.Errorf("placeholder key %s: %w", phPath, errors.Join(err, errors.New("too short")))
	}
	ca.phKey = ph
	if ca.leafKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, fmt.Errorf("generate leaf key: %w", err)
	}
	return ca, nil
}

func (ca *egressCA) parse(certPEM, keyPEM []byte) error {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return errors.New("not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return err
	}
	ca.cert, ca.certPEM, ca.key = cert, certPEM, key
	return nil
}

func newCA() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          randSerial(),
		Subject:               pkix.Name{CommonName: "sbx egress CA " + host, Organization: []string{"sbx"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func randSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// certFor returns a certificate for host signed by the CA.
func (ca *egressCA) certFor(host string) (*tls.Certificate, error) {
	host = strings.ToLower(host)
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("mint certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= leafCacheMax {
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	return c, nil
}

// placeholder is the stand-in value a box sees for its secret name: stable
// for (sandbox, name) across daemon restarts, unguessable without the
// daemon's key, recognisable, and made only of [a-z0-9_-] so it survives
// URLs and headers unescaped.
func (ca *egressCA) placeholder(sandbox, name string) string {
	mac := hmac.New(sha256.New, ca.phKey)
	mac.Write([]byte(sandbox + "\x00" + name))
	return "sbx-secret-" + strings.ToLower(name) + "-" + hex.EncodeToString(mac.Sum(nil))[:placeholderTail]
}

// writeBundle writes the host's CA bundle plus the CA to dir/bundle and
// returns that directory (mounted read-only into boxes with secrets). The
// directory is the root of a small tmpfs of its own: a bind's root field in
// mountinfo is the source's path inside its filesystem, so a bind of a
// directory of the data dir would show boxes the daemon's data dir, and a
// bind of a filesystem's root shows "/".
func (ca *egressCA) writeBundle(dir string) (string, error) {
	var buf bytes.Buffer
	for _, p := range hostBundles {
		if b, err := os.ReadFile(p); err == nil {
			buf.Write(b)
			if len(b) > 0 && b[len(b)-1] != '\n' {
				buf.WriteByte('\n')
			}
			break
		}
	}
	buf.WriteString("# sbx egress CA (intercepts TLS to the hosts of this sandbox's domain secrets only)\n")
	buf.Write(ca.certPEM)
	out := filepath.Join(dir, bundleDir)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", fmt.Errorf("create CA bundle dir: %w", err)
	}
	if err := mountBundleFS(out, len(buf.Bytes())); err != nil {
		return "", err
	}
	if err := writeFileAtomic(filepath.Join(out, bundleFile), buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	return out, nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", path, err)
	}
	return nil
}
