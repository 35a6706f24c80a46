package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// TestKubernetesReplicaKilledMidway kill -9s a replica of `sbx serve
// --state kubernetes` exactly inside a create and inside a destroy (it is
// started with one crash point armed, internal/crashpoint; the test kills
// it once the point says it was reached) and checks that the surviving
// replica B ends with a clean namespace by itself:
//   - killed after the pod and its TLS Secret were made, before the pod
//     ran (k8s-create-pod), and after the driver returned a running box
//     whose record still says creating (create-started): once the
//     creating grace passes, B's sweep deletes the pod, the Secrets and
//     the record, and frees the name;
//   - killed after the record was marked destroying, the pod still
//     running (destroy-marked): the sandbox is gone through B at once
//     (by name and id, and from the list), and once the teardown grace
//     passes B deletes the pod and the record.
//
// Afterwards the name is created, used and destroyed through B, and
// nothing is left in the namespace: no pod, no record, name claim or TLS
// Secret. The graces are lowered to seconds by flag; nothing sleeps, every
// wait is for a condition the API shows.
func TestKubernetesReplicaKilledMidway(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-rkill")
	img := c.AgentImage(t)
	// A create's pod runs within about 3 s here; 15 s keeps B's sweep off
	// creates still in progress before the kill.
	graces := []string{"--state-creating-grace", "15s", "--state-teardown-grace", "5s"}
	b := startReplicaOpts(t, c, ns, img, daemonOpts{}, graces...)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	for _, tc := range []struct {
		point   string
		destroy bool // killed in a destroy (else in a create)
	}{
		{"k8s-create-pod", false},
		{"create-started", false},
		{"destroy-marked", true},
	} {
		t.Run(tc.point, func(t *testing.T) {
			t0 := time.Now()
			name := "victim-" + tc.point
			var id string
			if tc.destroy {
				sb, err := b.client().Create(ctx, sbx.CreateOptions{Name: name, Image: k8stest.PyImage, Timeout: 10 * time.Minute})
				if err != nil {
					t.Fatalf("create through B: %v", err)
				}
				id = sb.ID
			}
			pointDir := t.TempDir()
			a := startReplicaOpts(t, c, ns, img, daemonOpts{env: []string{"SBX_CRASHPOINT_DIR=" + pointDir, "SBX_CRASHPOINTS=" + tc.point}}, graces...)
			answered := make(chan error, 1)
			go func() {
				if tc.destroy {
					answered <- a.client().Sandbox(id).Destroy(ctx)
					return
				}
				_, err := a.client().Create(ctx, sbx.CreateOptions{Name: name, Image: k8stest.PyImage, Timeout: 10 * time.Minute})
				answered <- err
			}()
			waitK8s(t, 2*time.Minute, "replica A to reach "+tc.point, func() bool {
				_, err := os.Stat(filepath.Join(pointDir, tc.point))
				return err == nil
			})
			a.kill9()
			killed := time.Now()
			if err := <-answered; err == nil {
				t.Errorf("the call through A killed at %s answered without an error", tc.point)
			}
			if !tc.destroy {
				// The half-made box's record names its id.
				recs, err := c.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/kind=sandbox-record"})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range recs.Items {
					id = strings.TrimPrefix(r.Name, "sbx-box-")
				}
				if len(recs.Items) != 1 {
					t.Fatalf("after the kill at %s: %d records, want the one being created", tc.point, len(recs.Items))
				}
			} else {
				// The destroy was marked: B no longer has the sandbox, by
				// name, id or list, though its pod still runs.
				for _, ref := range []string{name, id} {
					if _, err := b.client().Get(ctx, ref); !sbx.IsNotFound(err) {
						t.Errorf("get %s through B after A died in its destroy: %v, want not found", ref, err)
					}
				}
				if list, err := b.client().List(ctx); err != nil || len(list) != 0 {
					t.Errorf("list through B after A died in a destroy: %d sandboxes (%v), want none", len(list), err)
				}
			}
			waitK8s(t, 2*time.Minute, "replica B to clean up after A", func() bool {
				return len(namespaceLeft(t, c, ns)) == 0
			})
			t.Logf("%s: A reached the point %.1fs after the start, B cleaned up %.1fs after the kill",
				tc.point, killed.Sub(t0).Seconds(), time.Since(killed).Seconds())
			if _, err := b.client().Get(ctx, id); !sbx.IsNotFound(err) {
				t.Errorf("get %s through B after the cleanup: %v, want not found", id, err)
			}
			// The name is free and works again.
			sb, err := b.client().Create(ctx, sbx.CreateOptions{Name: name, Image: k8stest.PyImage})
			if err != nil {
				t.Fatalf("re-create of name %s through B: %v", name, err)
			}
			if r, err := sb.Run(ctx, "python3", "-c", "print(6*7)"); err != nil || strings.TrimSpace(stdout(r)) != "42" {
				t.Errorf("exec in the re-created sandbox: %q, %v", stdout(r), err)
			}
			if err := sb.Destroy(ctx); err != nil {
				t.Fatalf("destroy through B: %v", err)
			}
			waitK8s(t, time.Minute, "the re-created sandbox's pod and records to go", func() bool {
				return len(namespaceLeft(t, c, ns)) == 0
			})
		})
	}
}

// namespaceLeft lists what sbx made in ns that is still there: pods,
// records, name claims, process records and box TLS Secrets (the daemon's
// identity Secret stays).
func namespaceLeft(t *testing.T, c *k8stest.Cluster, ns string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var left []string
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"listing pods: " + err.Error()}
	}
	for _, p := range pods.Items {
		left = append(left, "pod "+p.Name)
	}
	secs, err := c.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"listing secrets: " + err.Error()}
	}
	for _, s := range secs.Items {
		if s.Labels["sbx.dev/kind"] != "" || s.Labels["sbx.dev/id"] != "" {
			left = append(left, fmt.Sprintf("secret %s (%s)", s.Name, s.Type))
		}
	}
	slices.Sort(left)
	return left
}
