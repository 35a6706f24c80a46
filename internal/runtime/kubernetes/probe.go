package kubernetes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sbxdev/sbx/internal/runtime"
)

// leftover is one object of a box not kept.
type leftover struct {
	id   string
	pod  bool
	name string
}

// list finds this driver's pods and box Secrets whose boxes are not in keep.
func (d *Driver) list(ctx context.Context, keep map[string]bool) ([]leftover, error) {
	opts := metav1.ListOptions{LabelSelector: d.selector()}
	pods, err := d.client.CoreV1().Pods(d.cfg.Namespace).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	secrets, err := d.client.CoreV1().Secrets(d.cfg.Namespace).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing secrets: %w", err)
	}
	var out []leftover
	for _, p := range pods.Items {
		if id := p.Labels[labelID]; !keep[id] {
			out = append(out, leftover{id: id, pod: true, name: p.Name})
		}
	}
	for _, s := range secrets.Items {
		if id := s.Labels[labelID]; id != "" && !keep[id] {
			out = append(out, leftover{id: id, name: s.Name})
		}
	}
	return out, nil
}

// Leftovers lists this driver's pods and box Secrets of boxes not in keep.
func (d *Driver) Leftovers(ctx context.Context, keep map[string]bool) ([]runtime.Leftover, error) {
	if d.health != "" {
		return nil, nil
	}
	left, err := d.list(ctx, keep)
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Leftover, 0, len(left))
	for _, l := range left {
		kind := "secret"
		if l.pod {
			kind = "pod"
		}
		out = append(out, runtime.Leftover{ID: l.id, What: fmt.Sprintf("%s %s/%s", kind, d.cfg.Namespace, l.name)})
	}
	return out, nil
}

// HostPids lists the host processes of the box container, found through
// its cgroup on this host: it works only where the daemon runs on the
// box's node (the test cluster).
func (d *Driver) HostPids(ctx context.Context, h runtime.Handle) ([]int, error) {
	hd, err := d.decode(h)
	if err != nil {
		return nil, err
	}
	pod, err := d.client.CoreV1().Pods(hd.Namespace).Get(ctx, hd.Pod, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading pod %s: %w", hd.Pod, err)
	}
	var cid string
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "box" {
			_, cid, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if cid == "" {
		return nil, fmt.Errorf("pod %s has no box container id", hd.Pod)
	}
	uid := strings.ReplaceAll(string(pod.UID), "-", "_")
	var files []string
	for _, pat := range []string{
		"/sys/fs/cgroup/pids/kubepods*/pod%[1]s/%[2]s/cgroup.procs", "/sys/fs/cgroup/pids/kubepods*/*/pod%[1]s/%[2]s/cgroup.procs",
		"/sys/fs/cgroup/kubepods*/pod%[1]s/%[2]s/cgroup.procs", "/sys/fs/cgroup/kubepods*/*/pod%[1]s/%[2]s/cgroup.procs",
	} {
		for _, u := range []string{string(pod.UID), uid} {
			m, _ := filepath.Glob(fmt.Sprintf(pat, u, cid))
			files = append(files, m...)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("pod %s: no cgroup of container %s on this host (is the daemon on the pod's node?)", hd.Pod, cid)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", files[0], err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

var _ runtime.Prober = (*Driver)(nil)
