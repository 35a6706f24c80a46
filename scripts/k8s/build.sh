#!/bin/bash
# Build every binary the single-node test cluster needs from the Go module proxy into $K/bin (default
# /var/cache/sbx-k8s/bin, so CI runs on one machine reuse it). Skips the build when $K/bin/.stamp says the same
# versions were built (FORCE=1 rebuilds).
#   Kubernetes v1.34.4: kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
#   containerd v2.1.5 (+ containerd-shim-runc-v2, ctr), etcd v3.6.5
#   optional (WITH_GVISOR=1): gVisor runsc + containerd-shim-runsc-v1 (1-line patch, see below)
# Needs: go >= 1.24 (gVisor: go >= 1.26.3) and the Go module proxy; nothing else from outside.
set -euo pipefail
K=${K:-/var/cache/sbx-k8s}; B=$K/bin; S=$K/src
KV=${KV:-1.34.4}; CV=${CV:-2.1.5}; EV=${EV:-3.6.5}; GV=${GV:-v0.0.0-20260905035102-160fafc42237}
STAMP="k8s=$KV containerd=$CV etcd=$EV gvisor=${WITH_GVISOR:-1}:$GV"
if [ "${FORCE:-0}" != 1 ] && [ -f $B/.stamp ] && [ "$(cat $B/.stamp)" = "$STAMP" ]; then
  echo "k8s build: cached in $B ($STAMP)"; exit 0
fi
export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
export GOCACHE=${GOCACHE:-$K/cache/gocache} GOMODCACHE=${GOMODCACHE:-$K/cache/gomod}   # cache these two dirs in CI
mkdir -p $B $S/k8s $S/containerd $S/etcd $S/gvisor
t() { local s=$(date +%s); "$@"; echo "  [$(( $(date +%s)-s ))s] $*" | cut -c1-160 >&2; }

# --- Kubernetes: wrapper module that pins every staging module (k8s.io/kubernetes' own go.mod uses ./staging replaces)
cd $S/k8s
cp "$(go mod download -json k8s.io/kubernetes@v$KV | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')" kubernetes.mod; chmod u+w kubernetes.mod
{ printf 'module k8sbuild\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' $KV
  grep -E '^\s+k8s.io/\S+ => ./staging' kubernetes.mod | awk -v v=v0.${KV#1.} '{print "\t"$1" => "$1" "v}'
  echo ')'; } > go.mod
CMDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"
t go get $(for c in $CMDS; do echo k8s.io/kubernetes/cmd/$c@v$KV; done)
V=k8s.io/component-base/version
t go build -trimpath -ldflags "-s -w -X $V.gitVersion=v$KV -X $V.gitMajor=1 -X $V.gitMinor=$(echo $KV | cut -d. -f2) -X $V.gitTreeState=clean -X $V.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=v$KV" \
  -o $B/ $(for c in $CMDS; do echo k8s.io/kubernetes/cmd/$c; done)

# --- containerd 2.x (Debian's 1.6 also works for runc pods, but not with the current gVisor shim)
cd $S/containerd
printf 'module ctrdbuild\n\ngo 1.24.0\n\nrequire github.com/containerd/containerd/v2 v%s\n' $CV > go.mod
C=github.com/containerd/containerd/v2/cmd
t go get $C/containerd@v$CV $C/containerd-shim-runc-v2@v$CV $C/ctr@v$CV
t go build -trimpath -tags no_btrfs,no_devmapper,no_zfs -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CV" \
  -o $B/ $C/containerd $C/containerd-shim-runc-v2 $C/ctr

# --- etcd 3.6 (Debian's etcd-server 3.4.23 also works)
cd $S/etcd
printf 'module etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 v%s\n' $EV > go.mod
t go get go.etcd.io/etcd/server/v3@v$EV
t go build -trimpath -ldflags "-s -w" -o $B/etcd go.etcd.io/etcd/server/v3

# --- gVisor (optional): the shim hard-codes oom_score_adj=-999 for itself, which needs CAP_SYS_RESOURCE;
#     this VM's root lacks that capability, so make EPERM non-fatal (local replace of the module).
if [ "${WITH_GVISOR:-1}" = 1 ]; then
  cd $S/gvisor
  t go mod download gvisor.dev/gvisor@$GV
  rm -rf gvisor-src; cp -r "$(go env GOMODCACHE)/gvisor.dev/gvisor@$GV" gvisor-src; chmod -R u+w gvisor-src
  sed -i 's|if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {|if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil \&\& !os.IsPermission(err) {|' gvisor-src/pkg/shim/v1/manager.go
  grep -q '!os.IsPermission(err) {' gvisor-src/pkg/shim/v1/manager.go || { echo "gVisor patch did not apply" >&2; exit 1; }
  printf 'module shimbuild\n\ngo 1.26.3\n\nrequire gvisor.dev/gvisor %s\n\nreplace gvisor.dev/gvisor => ./gvisor-src\n' $GV > go.mod
  cp gvisor-src/go.sum go.sum
  t go build -trimpath -ldflags "-s -w" -o $B/containerd-shim-runsc-v1 gvisor.dev/gvisor/shim
  t go build -trimpath -ldflags "-s -w" -o $B/runsc gvisor.dev/gvisor/runsc
fi
echo "$STAMP" > $B/.stamp
ls -la $B
