#!/bin/bash
# `make test-k8s`: the Kubernetes tests on a real single-node cluster. Builds the cluster's binaries (cached in
# $K, default /var/cache/sbx-k8s: a warm run skips the build), makes the test images once, brings the cluster up
# unless a healthy one already runs (then it is reused and left running), runs the tests and brings down only a
# cluster it started. Needs root. Extra `go test` flags: K8S_TEST_FLAGS (e.g. "-run TestConformance -v").
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
export K=${K:-/var/cache/sbx-k8s} PATH=/usr/local/go/bin:$PATH
T0=$(date +%s); ts() { echo "=== test-k8s [$(( $(date +%s)-T0 ))s] $*"; }

need=()
for pkg in containernetworking-plugins iptables runc busybox-static gcc libc6-dev curl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  ts "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

ts build; "$HERE/build.sh" > >(tail -3) 2>&1
for i in pause busybox pybox; do [ -f "$K/images/$i.tar" ] || { ts images; "$HERE/images.sh" >/dev/null; break; }; done

started=0
if "$HERE/cluster.sh" status; then
  ts "reusing the running cluster"
  for t in "$K"/images/*.tar; do   # images made after that cluster came up
    ref=$(tar -xOf "$t" index.json | sed -n 's/.*"io.containerd.image.name":"\([^"]*\)".*/\1/p')
    "$K/bin/ctr" -a "$K/run/containerd.sock" -n k8s.io images ls -q "name==$ref" | grep -q . ||
      "$K/bin/ctr" -a "$K/run/containerd.sock" -n k8s.io images import "$t" >/dev/null
  done
else
  ts "cluster up"; "$HERE/cluster.sh" up; started=1
fi
trap '[ $started = 1 ] && { ts "cluster down"; "$HERE/cluster.sh" down; }' EXIT

ts tests
cd "$ROOT"
# shellcheck disable=SC2086
SBX_K8S_DIR=$K go test -race -count=1 -timeout 20m ${K8S_TEST_FLAGS:-} ./internal/runtime/kubernetes/...
# shellcheck disable=SC2086
SBX_K8S_DIR=$K go test -race -count=1 -timeout 10m ${K8S_TEST_FLAGS:-} ./internal/store/kubestore/
# shellcheck disable=SC2086
SBX_K8S_DIR=$K go test -race -count=1 -timeout 10m -run 'TestReplica|TestSharedState' ${K8S_TEST_FLAGS:-} ./internal/sandbox/ ./internal/daemon/
# shellcheck disable=SC2086
SBX_K8S_DIR=$K go test -race -count=1 -timeout 10m -run 'TestKubernetes' ${K8S_TEST_FLAGS:-} ./integration/
ts done
