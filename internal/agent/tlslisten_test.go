package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func testKeyPair(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// TestLoadTLSDir: the agent's TLS files are gone once read, and its
// listener answers only the pinned daemon certificate.
func TestLoadTLSDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	agentCert, agentKey := testKeyPair(t, "agent")
	daemonCert, daemonKey := testKeyPair(t, "daemon")
	otherCert, otherKey := testKeyPair(t, "other")
	for name, b := range map[string][]byte{TLSAgentCert: agentCert, TLSAgentKey: agentKey, TLSDaemonCerts: daemonCert} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := LoadTLSDir(dir)
	if err != nil {
		t.Fatalf("LoadTLSDir: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("tls dir after loading: stat err %v, want it removed", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ln = newTLSListener(ln, conf)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte("ok"))
			}()
		}
	}()
	tests := []struct {
		name      string
		cert, key []byte
		wantOK    bool
	}{
		{"daemon", daemonCert, daemonKey, true},
		{"other certificate", otherCert, otherKey, false},
		{"no certificate", nil, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cc := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
			if tc.cert != nil {
				pair, err := tls.X509KeyPair(tc.cert, tc.key)
				if err != nil {
					t.Fatal(err)
				}
				cc.Certificates = []tls.Certificate{pair}
			}
			c, err := tls.Dial("tcp", ln.Addr().String(), cc)
			var got []byte
			if err == nil {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				got, err = io.ReadAll(c)
				c.Close()
			}
			if ok := err == nil && string(got) == "ok"; ok != tc.wantOK {
				t.Errorf("client with %s: got %q, %v; want served = %v", tc.name, got, err, tc.wantOK)
			}
		})
	}
}
