package kubernetes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/runtime"
)

// The agent endpoint. A pod's agent listens on the pod IP, which every pod
// of the cluster (and, on many clusters, the nodes) can reach, and so can
// user code in the box itself. So the agent serves only TLS 1.3 with
// mutual authentication by pinned certificates:
//
//   - the daemon's identity: one key pair per namespace and instance, kept
//     in the Secret identitySecret (so every replica of a daemon has it,
//     and only those RBAC lets read Secrets there). Each agent accepts only
//     a client presenting exactly that certificate.
//   - the box's own key pair, made per box by Create and handed to the pod
//     through a Secret that only the init container mounts; the agent reads
//     and deletes its copy before any user code starts, and Create deletes
//     the Secret once the agent answers. The daemon pins the certificate
//     (its SHA-256 is in the handle), so no other pod (one that took over a
//     deleted box's IP, or spoofs it) passes for the agent.
//
// The handshake needs no DNS name or CA: both sides compare certificates
// byte for byte.

// identitySecret names the Secret holding the daemon's client key pair.
func identitySecret(instance string) string { return "sbx-daemon-identity-" + instance }

// identity is the daemon's client certificate for agents.
type identity struct {
	cert    tls.Certificate
	certPEM []byte
}

// loadIdentity reads the daemon's identity Secret, creating it if missing
// (replicas racing to create it: the loser reads the winner's).
func loadIdentity(ctx context.Context, c k8s.Interface, ns, instance string) (*identity, error) {
	secrets := c.CoreV1().Secrets(ns)
	name := identitySecret(instance)
	for range 3 {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return parseIdentity(s.Data["tls.crt"], s.Data["tls.key"])
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading identity secret %s/%s: %w", ns, name, err)
		}
		certPEM, keyPEM, err := selfSigned("sbx-daemon")
		if err != nil {
			return nil, err
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{labelManagedBy: "sbx", labelInstance: instance}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM},
		}
		if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err == nil {
			return parseIdentity(certPEM, keyPEM)
		} else if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating identity secret %s/%s: %w", ns, name, err)
		}
	}
	return nil, fmt.Errorf("identity secret %s/%s: created and deleted concurrently", ns, name)
}

func parseIdentity(certPEM, keyPEM []byte) (*identity, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("daemon identity key pair: %w", err)
	}
	return &identity{cert: cert, certPEM: certPEM}, nil
}

// selfSigned makes an ECDSA P-256 key and a self-signed certificate for cn.
func selfSigned(cn string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("generating serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(100, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("making certificate: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// boxCert is one box's agent key pair and the pin of its certificate.
type boxCert struct {
	certPEM, keyPEM []byte
	pin             string
}

func newBoxCert(id string) (*boxCert, error) {
	certPEM, keyPEM, err := selfSigned("sbx-agent-" + id)
	if err != nil {
		return nil, fmt.Errorf("box %s agent certificate: %w", id, err)
	}
	b, _ := pem.Decode(certPEM)
	sum := sha256.Sum256(b.Bytes)
	return &boxCert{certPEM: certPEM, keyPEM: keyPEM, pin: hex.EncodeToString(sum[:])}, nil
}

func encodeHandle(id, driver string, hd handleData) (runtime.Handle, error) {
	b, err := json.Marshal(hd)
	if err != nil {
		return runtime.Handle{}, fmt.Errorf("encoding handle of box %s: %w", id, err)
	}
	return runtime.Handle{ID: id, Driver: driver, Data: b}, nil
}

// dial opens a mutually authenticated TLS connection to port on the box's
// pod IP (in the handle: a pod keeps its IP for its life, and the pin
// catches another pod that got the IP after this one).
func (d *Driver) dial(ctx context.Context, h runtime.Handle, port int) (net.Conn, error) {
	hd, err := d.decode(h)
	if err != nil {
		return nil, err
	}
	if d.id == nil {
		return nil, fmt.Errorf("kubernetes runtime is unhealthy: %s: %w", d.health, errdefs.ErrUnavailable)
	}
	return DialAgent(ctx, net.JoinHostPort(hd.IP, strconv.Itoa(port)), d.id.cert, hd.AgentCert)
}

// DialAgent connects to an agent's TLS listener at addr as client,
// accepting only the agent certificate whose SHA-256 (hex) is pin. Tests
// use it to play other clients.
func DialAgent(ctx context.Context, addr string, client tls.Certificate, pin string) (net.Conn, error) {
	conf := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{client},
		// No CA and no name: the agent's certificate is pinned instead.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("agent presented no certificate")
			}
			sum := sha256.Sum256(raw[0])
			if hex.EncodeToString(sum[:]) != pin {
				return errors.New("agent certificate is not the box's")
			}
			return nil
		},
	}
	dialer := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: conf}
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing agent at %s: %w", addr, err)
	}
	return c, nil
}

// hello says Hello to the box's agent.
func (d *Driver) hello(ctx context.Context, h runtime.Handle) error {
	c := agentconn.New(func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, h) })
	defer c.Close()
	_, err := c.Hello(ctx)
	return err
}
