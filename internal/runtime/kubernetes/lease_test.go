package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sbxdev/sbx/internal/runtime/kubernetes"
	"github.com/sbxdev/sbx/internal/runtime/kubernetes/k8stest"
)

// deployRole is the daemon's Role in deploy/kubernetes/rbac.yaml.
func deployRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var r rbacv1.Role
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			t.Fatal("rbac.yaml has no Role")
		} else if err != nil {
			t.Fatalf("decoding rbac.yaml: %v", err)
		}
		if r.Kind == "Role" {
			return &r
		}
	}
}

// asDeployRole gives the deploy Role to a service account of ns and
// returns a client acting as it (impersonation by the test's admin).
func asDeployRole(t *testing.T, c *k8stest.Cluster, ns string) k8s.Interface {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := deployRole(t)
	role.ObjectMeta = metav1.ObjectMeta{Name: "sbx-daemon", Namespace: ns}
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sbx"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sbx-daemon"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "sbx", Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "sbx-daemon"},
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(c.Dir, "pki", "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = "system:serviceaccount:" + ns + ":sbx"
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestDeployRoleLeases checks, as the deploy Role's service account
// (kubectl auth can-i's SelfSubjectAccessReview), that the Role grants
// exactly the Lease verbs the warm pool uses: create, get, list, update,
// delete; not watch, patch or deletecollection, nor Leases elsewhere.
func TestDeployRoleLeases(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-rbac")
	as := asDeployRole(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		ns, verb string
		want     bool
	}{
		{ns, "create", true}, {ns, "get", true}, {ns, "list", true}, {ns, "update", true}, {ns, "delete", true},
		{ns, "watch", false}, {ns, "patch", false}, {ns, "deletecollection", false},
		{"kube-system", "get", false}, {"kube-node-lease", "update", false},
	} {
		r, err := as.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: tc.ns, Verb: tc.verb, Group: "coordination.k8s.io", Resource: "leases"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("access review: %v", err)
		}
		if r.Status.Allowed != tc.want {
			t.Errorf("can-i %s leases -n %s: got %v, want %v", tc.verb, tc.ns, r.Status.Allowed, tc.want)
		}
	}
}

// TestPoolOrphanSweep runs a driver with a pool as the deploy Role's
// service account, its Lease lasting 3 s, beside objects of three other
// pool owners: "gone" has a pool pod and no Lease, "dead" a pool pod, a
// pool Secret and a Lease nobody renews, "live" a pool pod and a Lease the
// test renews. The driver's sweep deletes gone's and dead's pods, dead's
// Secret and Lease; it keeps live's pod and a box pod without pool labels
// (a claimed one); its own Lease is renewed, and Close deletes it.
func TestPoolOrphanSweep(t *testing.T) {
	c := k8stest.Get(t)
	ns := c.Namespace(t, "sbx-sweep")
	img := c.AgentImage(t)
	c.EnsurePyImage(t)
	as := asDeployRole(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	labels := func(owner string) map[string]string {
		return map[string]string{"app.kubernetes.io/managed-by": "sbx", "sbx.dev/runtime": "kubernetes", "sbx.dev/instance": "default",
			"sbx.dev/pool": "0123456789abcdef0123", "sbx.dev/pool-owner": owner}
	}
	pod := func(name string, l map[string]string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: k8stest.PyImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}}}},
		}}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lease := func(owner string) *coordv1.Lease {
		t.Helper()
		secs, now := int32(3), metav1.NewMicroTime(time.Now())
		l, err := c.Client.CoordinationV1().Leases(ns).Create(ctx, &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "sbx-pool-kubernetes-" + owner, Labels: labels(owner)},
			Spec:       coordv1.LeaseSpec{HolderIdentity: &owner, LeaseDurationSeconds: &secs, RenewTime: &now},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	pod("pool-gone", labels("gone"))
	pod("pool-dead", labels("dead"))
	pod("pool-live", labels("live"))
	claimedLabels := labels("dead")
	delete(claimedLabels, "sbx.dev/pool")
	delete(claimedLabels, "sbx.dev/pool-owner")
	claimedLabels["sbx.dev/id"] = "claimedbox"
	pod("sbx-claimedbox", claimedLabels)
	if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sbx-wdead-tls", Labels: labels("dead")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lease("dead")
	live := lease("live")
	renewed := make(chan struct{})
	stopRenew := make(chan struct{})
	go func() { // the live owner renews every half second
		defer close(renewed)
		for {
			select {
			case <-stopRenew:
				return
			case <-time.After(500 * time.Millisecond):
			}
			now := metav1.NewMicroTime(time.Now())
			live.Spec.RenewTime = &now
			if l, err := c.Client.CoordinationV1().Leases(ns).Update(ctx, live, metav1.UpdateOptions{}); err == nil {
				live = l
			}
		}
	}()

	spec := poolSpec()
	d, err := kubernetes.New(ctx, kubernetes.Config{Client: as, Namespace: ns, AgentImage: img, PullPolicy: corev1.PullNever,
		Pool: []kubernetes.PoolSpec{{Image: spec.Image.Ref, Resources: spec.Resources, Size: 1}}, LeaseDuration: 3 * time.Second, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if info := d.Info(ctx); !info.Healthy {
		t.Fatalf("driver as the deploy Role unhealthy: %s", info.Detail)
	}
	d.StartPool()
	t.Cleanup(func() { _ = d.Close(context.Background()) }) // a failed test too: no filler outlives it
	start := time.Now()
	exists := func(get func() error) bool { return !apierrors.IsNotFound(get()) }
	pods, secrets, leases := c.Client.CoreV1().Pods(ns), c.Client.CoreV1().Secrets(ns), c.Client.CoordinationV1().Leases(ns)
	waitFor(t, time.Minute, "the sweep to delete gone's and dead's pool objects", func() bool {
		for _, get := range []func() error{
			func() error { _, err := pods.Get(ctx, "pool-gone", metav1.GetOptions{}); return err },
			func() error { p, err := pods.Get(ctx, "pool-dead", metav1.GetOptions{}); return deleting(p, err) },
			func() error { _, err := secrets.Get(ctx, "sbx-wdead-tls", metav1.GetOptions{}); return err },
			func() error { _, err := leases.Get(ctx, "sbx-pool-kubernetes-dead", metav1.GetOptions{}); return err },
		} {
			if exists(get) {
				return false
			}
		}
		return true
	})
	t.Logf("dead owner's pool objects deleted %.1fs after the driver started (lease 3 s)", time.Since(start).Seconds())
	// The pool fills under the driver's own Lease.
	waitFor(t, 2*time.Minute, "the driver's pool pod", func() bool {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/warm=ready"})
		return err == nil && len(l.Items) == 1
	})
	for _, name := range []string{"pool-live", "sbx-claimedbox"} {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Errorf("pod %s: %v (deleting %v), want it kept", name, err, err == nil && p.DeletionTimestamp != nil)
		}
	}
	if _, err := leases.Get(ctx, "sbx-pool-kubernetes-live", metav1.GetOptions{}); err != nil {
		t.Errorf("live owner's lease: %v, want it kept", err)
	}
	close(stopRenew)
	<-renewed
	own, err := leases.List(ctx, metav1.ListOptions{LabelSelector: "sbx.dev/pool-owner notin (live)"})
	if err != nil || len(own.Items) != 1 {
		t.Fatalf("the driver's lease: %d (%v), want 1", len(own.Items), err)
	}
	rv := own.Items[0].ResourceVersion
	waitFor(t, 30*time.Second, "the driver to renew its lease", func() bool {
		l, err := leases.Get(ctx, own.Items[0].Name, metav1.GetOptions{})
		return err == nil && l.ResourceVersion != rv
	})
	if err := d.Close(ctx); err != nil {
		t.Fatalf("close as the deploy Role: %v", err)
	}
	if _, err := leases.Get(ctx, own.Items[0].Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the driver's lease after Close: %v, want NotFound", err)
	}
}

// deleting is err, or NotFound for a pod being deleted.
func deleting(p *corev1.Pod, err error) error {
	if err == nil && p.DeletionTimestamp != nil {
		return apierrors.NewNotFound(corev1.Resource("pods"), p.Name)
	}
	return err
}

// waitFor polls cond until it holds or timeout passes (then fails t).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
