package kubernetes_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	"github.com/sbxdev/sbx/internal/runtime/testsuite"
)

// attackPy drives an agent at argv[1] the way a client without the
// daemon's key can: plain HTTP/1.1 (Connect's unary protocol, JSON) and
// TLS without a client certificate, on the API and the exec port. The
// request is StartProcess, which runs a command as the box's root: it
// writes argv[2] in the target box. It prints one line per attempt,
// "ANSWERED" if the agent's HTTP server parsed the request (any HTTP
// answer: a 409 for a process id already taken means it was driven too).
const attackPy = `
import json, socket, ssl, sys
host, marker = sys.argv[1], sys.argv[2]
def request(id):
    body = json.dumps({"id": id, "exec": {"argv": ["/bin/sh", "-c", "echo pwned > " + marker]}}).encode()
    return (b"POST /agent.v1.AgentService/StartProcess HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
def talk(s, id):
    s.settimeout(5)
    s.sendall(request(id))
    data = b""
    while True:
        b = s.recv(4096)
        if not b:
            return data
        data += b
def plain(port):
    return talk(socket.create_connection((host, port), 5), "pwn-plain-%s-%d-%s" % (host, port, marker[-9:]))
def tls(port):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return talk(ctx.wrap_socket(socket.create_connection((host, port), 5)), "pwn-tls-%s-%d-%s" % (host, port, marker[-9:]))
for name, f in (("plain", plain), ("tls-no-cert", tls)):
    for port in (7700, 7701):
        try:
            r = f(port)
            print(name, port, "ANSWERED" if r.startswith(b"HTTP/") else "refused", repr(r[:40]))
        except Exception as e:
            print(name, port, "refused", type(e).__name__)
`

// stealSh looks, as box root, for the key material the agent was given:
// its TLS files, its environment and memory, a service account token.
const stealSh = `
ls -A /.sbx/run/tls 2>/dev/null | sed 's/^/tlsdir: /'
find /.sbx /etc /tmp /root -type f ! -path /.sbx/sbx-agent -exec grep -l "PRIVATE KEY" {} + 2>/dev/null | sed 's/^/key file: /'
cat /proc/1/environ >/dev/null 2>&1 && echo "read: /proc/1/environ"
dd if=/proc/1/mem bs=1 count=1 skip=4194304 >/dev/null 2>&1 && echo "read: /proc/1/mem"
ls /var/run/secrets/kubernetes.io 2>/dev/null | sed 's/^/sa: /'
true
`

// TestAgentEndpointAttack: code in the box (as root) and a neighbour pod
// try to drive the box's agent without the daemon's key, over plain
// HTTP and over TLS with no or another client certificate, and look for
// the key; none gets an answer, the box runs nothing of theirs, and the
// daemon still drives the agent. On the design before pinned mutual TLS
// (the agent on plain TCP) the first request ran a command in the box.
func TestAgentEndpointAttack(t *testing.T) {
	d := newDriverFunc(t, "")(t)
	c := k8stest.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	victim := testsuite.Create(t, d, withImage(testsuite.NewSpec("victim")))
	var hd struct {
		IP        string `json:"ip"`
		NS        string `json:"ns"`
		AgentCert string `json:"agentCert"`
	}
	if err := json.Unmarshal(victim.Data, &hd); err != nil || net.ParseIP(hd.IP) == nil {
		t.Fatalf("victim handle %s: no pod ip (%v)", victim.Data, err)
	}

	// From inside the box, as root: the agent over the pod IP and loopback.
	inBox := withImage(testsuite.NewSpec("attacker"))
	attacker := testsuite.Create(t, d, inBox)
	for _, target := range []struct {
		box  runtime.Handle
		host string
	}{{victim, "127.0.0.1"}, {victim, hd.IP}, {attacker, hd.IP}} {
		r := testsuite.MustExec(t, d, target.box, "/usr/bin/python3", "-c", attackPy, target.host, "/tmp/pwned-by-box")
		t.Logf("from box %s to %s:\n%s%s", target.box.ID, target.host, r.Stdout, r.Stderr)
		if strings.Contains(r.Stdout, "ANSWERED") || strings.Count(r.Stdout, "refused") != 4 {
			t.Errorf("box %s driving the agent at %s: got %q, want 4 refusals", target.box.ID, target.host, r.Stdout)
		}
	}
	r := testsuite.MustExec(t, d, victim, "/bin/sh", "-c", stealSh)
	if strings.TrimSpace(r.Stdout) != "" {
		t.Errorf("box root found the agent's secrets:\n%s", r.Stdout)
	}

	// A neighbour pod in the same namespace runs the same attack.
	pods := c.Client.CoreV1().Pods(hd.NS)
	f := false
	nb := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "neighbour"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: &f,
			Containers: []corev1.Container{{
				Name: "attack", Image: k8stest.PyImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/usr/bin/python3", "-c", attackPy, hd.IP, "/tmp/pwned-by-neighbour"},
			}},
		},
	}
	if _, err := pods.Create(ctx, nb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the neighbour pod: %v", err)
	}
	t.Cleanup(func() {
		_ = pods.Delete(context.Background(), nb.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	for {
		p, err := pods.Get(ctx, nb.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("neighbour pod: %v", err)
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("neighbour pod did not finish: %s", p.Status.Phase)
		case <-time.After(200 * time.Millisecond):
		}
	}
	logs, err := pods.GetLogs(nb.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("neighbour logs: %v", err)
	}
	t.Logf("from the neighbour pod:\n%s", logs)
	if strings.Contains(string(logs), "ANSWERED") || strings.Count(string(logs), "refused") != 4 {
		t.Errorf("neighbour pod driving the agent: got %q, want 4 refusals", logs)
	}

	// A client with a certificate of its own (another daemon, or a pod
	// that made one) fails the handshake on both ports.
	other, err := tls.X509KeyPair(selfSignedForTest(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []int{7700, 7701} {
		conn, err := kubernetes.DialAgent(ctx, net.JoinHostPort(hd.IP, fmt.Sprint(port)), other, hd.AgentCert)
		if err == nil {
			// TLS 1.3: the server's refusal of the client certificate
			// arrives with the first read.
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("port %d with another client certificate: got %v, want the handshake refused for the certificate", port, err)
		}
	}

	// Nothing ran in the victim, and the daemon still drives it.
	r = testsuite.MustExec(t, d, victim, "/bin/sh", "-c", "ls /tmp")
	if strings.Contains(r.Stdout, "pwned") || r.ExitCode != 0 {
		t.Errorf("the victim's /tmp after the attacks: %+v, want no pwned-* files", r)
	}
}

func withImage(s runtime.Spec) runtime.Spec {
	s.Image = *podImage
	return s
}

// selfSignedForTest makes a client key pair nobody pinned.
func selfSignedForTest(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sbx-daemon"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}
