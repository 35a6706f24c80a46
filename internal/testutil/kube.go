package testutil

import (
	"os"
	"testing"
)

// KubeconfigEnv names the kubeconfig of a real cluster that tests of the
// Kubernetes state backend use (each in a namespace of its own, deleted at
// its end); scripts/k8s brings one up.
const KubeconfigEnv = "SBX_TEST_KUBECONFIG"

// RequiresKube returns the kubeconfig path of the test cluster, skipping
// the test when none is set.
func RequiresKube(t testing.TB) string {
	t.Helper()
	p := os.Getenv(KubeconfigEnv)
	if p == "" {
		t.Skipf("requires a Kubernetes cluster: set %s to its kubeconfig", KubeconfigEnv)
	}
	return p
}
