// Package k8stest gives tests a real Kubernetes cluster: the single-node
// test cluster scripts/k8s/cluster.sh runs (SBX_K8S_DIR names its state
// dir; `make test-k8s` sets it). It builds the agent image from this
// checkout and imports it into the node's containerd, and makes
// namespaces of the test's own. Only _test.go files import it.
package k8stest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sbxdev/sbx/internal/testutil"
)

// DirEnv names the test cluster's state dir (scripts/k8s: K).
const DirEnv = "SBX_K8S_DIR"

// PyImage is the preloaded image with busybox and python3 (images.sh).
const PyImage = "sbx.local/pybox:1"

// Cluster is the test cluster.
type Cluster struct {
	Dir    string
	Client k8s.Interface
}

var (
	once    sync.Once
	cluster *Cluster
	initErr error
)

// Get returns the test cluster, or skips the test when SBX_K8S_DIR is
// not set (fails it when set but unusable).
func Get(t testing.TB) *Cluster {
	t.Helper()
	dir := os.Getenv(DirEnv)
	if dir == "" {
		t.Skipf("no Kubernetes test cluster (%s unset; run make test-k8s)", DirEnv)
	}
	once.Do(func() {
		cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "pki", "admin.kubeconfig"))
		if err != nil {
			initErr = fmt.Errorf("loading kubeconfig: %w", err)
			return
		}
		cfg.QPS, cfg.Burst = 200, 400
		c, err := k8s.NewForConfig(cfg)
		if err != nil {
			initErr = fmt.Errorf("client: %w", err)
			return
		}
		cluster = &Cluster{Dir: dir, Client: c}
	})
	if initErr != nil {
		t.Fatalf("test cluster in %s: %v", dir, initErr)
	}
	return cluster
}

// Namespace makes a namespace for the test, deleted when it ends.
func (c *Cluster) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), got.Name, metav1.DeleteOptions{})
	})
	return got.Name
}

// EnsurePyImage imports PyImage from images.sh's tarball unless the
// node's containerd has it (the kubelet removes images under disk pressure).
func (c *Cluster) EnsurePyImage(t testing.TB) string {
	t.Helper()
	if out, err := c.ctr("images", "ls", "-q", "name=="+PyImage); err == nil && strings.TrimSpace(out) == PyImage {
		return PyImage
	}
	if out, err := c.ctr("images", "import", filepath.Join(c.Dir, "images", "pybox.tar")); err != nil {
		t.Fatalf("importing %s (scripts/k8s/images.sh makes it): %v: %s", PyImage, err, out)
	}
	return PyImage
}

var agentImage struct {
	sync.Once
	ref string
	err error
}

// AgentImage returns the reference of an image holding this checkout's
// static sbx-agent at /sbx-agent, imported into the node's containerd
// (named by the binary's digest, so a cached cluster never runs an old
// agent).
func (c *Cluster) AgentImage(t testing.TB) string {
	t.Helper()
	bin := testutil.AgentBinary(t)
	agentImage.Do(func() { agentImage.ref, agentImage.err = c.importAgent(bin) })
	if agentImage.err != nil {
		t.Fatalf("agent image: %v", agentImage.err)
	}
	return agentImage.ref
}

func (c *Cluster) importAgent(bin string) (string, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	ref := "sbx.local/sbx-agent:" + hex.EncodeToString(sum[:8])
	if out, err := c.ctr("images", "ls", "-q", "name=="+ref); err == nil && strings.TrimSpace(out) == ref {
		return ref, nil
	}
	tarball, err := ociArchive(ref, map[string][]byte{"sbx-agent": data}, []string{"/sbx-agent"})
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "sbx-agent-image-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(tarball); err != nil {
		f.Close()
		return "", err
	}
	f.Close()
	if out, err := c.ctr("images", "import", f.Name()); err != nil {
		return "", fmt.Errorf("ctr images import: %w: %s", err, out)
	}
	return ref, nil
}

func (c *Cluster) ctr(args ...string) (string, error) {
	argv := append([]string{"-a", filepath.Join(c.Dir, "run", "containerd.sock"), "-n", "k8s.io"}, args...)
	out, err := exec.Command(filepath.Join(c.Dir, "bin", "ctr"), argv...).CombinedOutput()
	return string(out), err
}

// ociArchive is an OCI image layout tar of one layer holding files (mode
// 0755 at the root), named ref, whose entrypoint is ep.
func ociArchive(ref string, files map[string][]byte, ep []string) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		s := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(s[:])
		blobs[d] = b
		return d, len(b)
	}
	ld, ls := put(layer.Bytes())
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": ep},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{ld}},
	})
	cd, cs := put(cfg)
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ls}},
	})
	md, ms := put(man)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
			"platform":    map[string]string{"architecture": "amd64", "os": "linux"},
			"annotations": map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref[strings.LastIndex(ref, ":")+1:]},
		}},
	})
	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	add := func(name string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := add("index.json", index); err != nil {
		return nil, err
	}
	for d, b := range blobs {
		if err := add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b); err != nil {
			return nil, err
		}
	}
	if err := ow.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
