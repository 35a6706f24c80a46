package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Agents that listen on the network (the kubernetes driver's pods, whose
// agent is reached over the pod IP) serve only mutually authenticated TLS:
// `--listen tls:ADDR --exec tls:ADDR --tls-dir DIR`. DIR holds the files
// below, written by the pod's init container before the agent (and so any
// user code) starts; the agent reads them and removes them at once, so
// user code that comes later finds nothing to steal, and the key lives on
// only in the agent's memory, which user code cannot read (harden:
// PR_SET_DUMPABLE 0, no CAP_SYS_PTRACE in a box).
const (
	// TLSAgentCert and TLSAgentKey are the box's own certificate and key
	// (PEM), made by the daemon for this box alone; the daemon pins the
	// certificate, so another box (or a pod that took over the IP of a
	// deleted one) cannot pass for this agent.
	TLSAgentCert = "agent.crt"
	TLSAgentKey  = "agent.key"
	// TLSDaemonCerts are the daemon certificates (PEM, one or more) whose
	// holders may drive the agent: a client must present one of them
	// exactly. Anything else (a neighbour pod, user code in the box, a
	// client with another certificate) fails the handshake.
	TLSDaemonCerts = "daemon.crt"
)

// tlsFileMax bounds each file read from the TLS dir.
const tlsFileMax = 64 << 10

// LoadTLSDir reads the agent's TLS material from dir and removes the
// files (and dir, if then empty). It returns the server config every tls:
// listener uses: TLS 1.3 only, the client's certificate required and
// compared byte for byte with the pinned daemon certificates.
func LoadTLSDir(dir string) (*tls.Config, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("opening tls dir: %w", err)
	}
	defer root.Close()
	read := func(name string) ([]byte, error) {
		f, err := root.Open(name)
		if err != nil {
			return nil, fmt.Errorf("reading tls file: %w", err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, tlsFileMax+1))
		if err != nil {
			return nil, fmt.Errorf("reading tls file %s: %w", name, err)
		}
		if len(b) > tlsFileMax {
			return nil, fmt.Errorf("tls file %s is over %d bytes", name, tlsFileMax)
		}
		return b, nil
	}
	var files [3][]byte
	for i, name := range []string{TLSAgentCert, TLSAgentKey, TLSDaemonCerts} {
		if files[i], err = read(name); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{TLSAgentKey, TLSAgentCert, TLSDaemonCerts} {
		if err := root.Remove(name); err != nil {
			return nil, fmt.Errorf("removing tls file: %w", err)
		}
	}
	_ = os.Remove(dir)
	return TLSServerConfig(files[0], files[1], files[2])
}

// TLSServerConfig builds the agent's TLS config from its certificate and
// key and the pinned daemon certificates (PEM).
func TLSServerConfig(certPEM, keyPEM, daemonPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("agent tls key pair: %w", err)
	}
	var pins [][sha256.Size]byte
	for rest := daemonPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return nil, fmt.Errorf("daemon certificate: %w", err)
		}
		pins = append(pins, sha256.Sum256(b.Bytes))
	}
	if len(pins) == 0 {
		return nil, errors.New("no daemon certificate to pin")
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no client certificate")
			}
			sum := sha256.Sum256(raw[0])
			for _, p := range pins {
				if bytes.Equal(sum[:], p[:]) {
					return nil
				}
			}
			return errors.New("client certificate is not the daemon's")
		},
	}, nil
}

// tlsHandshakeTimeout bounds a client's TLS handshake.
const tlsHandshakeTimeout = 10 * time.Second

// tlsListener accepts TCP connections and hands them on as plain
// net.Conns that run the TLS handshake (bounded) on their first read or
// write: the HTTP server then treats them as it treats the Unix sockets
// (HTTP/2 with prior knowledge), and a slow client never holds up Accept.
type tlsListener struct {
	net.Listener
	conf *tls.Config
}

func newTLSListener(ln net.Listener, conf *tls.Config) net.Listener {
	return &tlsListener{Listener: ln, conf: conf}
}

func (l *tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tlsServerConn{Conn: tls.Server(c, l.conf)}, nil
}

// tlsServerConn is a *tls.Conn behind the plain net.Conn interface.
type tlsServerConn struct {
	net.Conn // *tls.Conn
	once     sync.Once
	err      error
}

func (c *tlsServerConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), tlsHandshakeTimeout)
		defer cancel()
		c.err = c.Conn.(*tls.Conn).HandshakeContext(ctx)
	})
	return c.err
}

func (c *tlsServerConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *tlsServerConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// InstallArg is argv[1] of the agent binary run as a pod's init container
// (`sbx-agent sbx-install BINDIR TLSSRC TLSDST`): it copies itself to
// BINDIR/sbx-agent (an emptyDir the box's container mounts read-only at
// /.sbx, so any image runs the agent), makes BINDIR/run (the mount point
// of the box's writable /.sbx/run) and copies the TLS files from TLSSRC (a
// Secret only the init container mounts) into TLSDST (mode 0700, files
// 0400), where the agent reads and removes them.
const InstallArg = "sbx-install"

// Install is the sbx-install helper.
func Install(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: sbx-agent %s BINDIR TLSSRC TLSDST", InstallArg)
	}
	bindir, src, dst := args[0], args[1], args[2]
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("opening own binary: %w", err)
	}
	defer self.Close()
	if err := writeFile(filepath.Join(bindir, "sbx-agent"), self, 0o555); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(bindir, "run"), 0o755); err != nil {
		return fmt.Errorf("making run mount point: %w", err)
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("making tls dir: %w", err)
	}
	for _, name := range []string{TLSAgentCert, TLSAgentKey, TLSDaemonCerts} {
		f, err := os.Open(filepath.Join(src, name))
		if err != nil {
			return fmt.Errorf("reading tls file: %w", err)
		}
		err = writeFile(filepath.Join(dst, name), io.LimitReader(f, tlsFileMax+1), 0o400)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("installing %s: %w", path, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("installing %s: %w", path, err)
	}
	return f.Close()
}
