#!/bin/bash
# Single-node Kubernetes on this VM: etcd + kube-apiserver + kube-controller-manager + kube-scheduler
# + kubelet + containerd (runc; optional gVisor runsc RuntimeClass). All state under $K (default
# /var/cache/sbx-k8s; binaries from build.sh, images from images.sh). Fixed node IP and ports: one per host.
# usage: cluster.sh up | down | status   (status: exit 0 if the API server answers and the node is Ready)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
K=${K:-/var/cache/sbx-k8s}; B=$K/bin; P=$K/pki; L=$K/logs; R=$K/run
NODE=${NODE:-k8s-node}   # fixed name: kubelet client cert CN is system:node:$NODE
NODE_IP=${NODE_IP:-10.200.0.1}
export KUBECONFIG=$P/admin.kubeconfig KUBECACHEDIR=$K/kubectl-cache
mkdir -p $L $R
start() { # name cmd...   (plain background command => $! is the daemon's own pid)
  local n=$1; shift
  if [ -f $R/$n.pid ] && kill -0 $(cat $R/$n.pid) 2>/dev/null; then echo "$n already running"; return; fi
  setsid "$@" > $L/$n.log 2>&1 < /dev/null &
  echo $! > $R/$n.pid; echo "started $n pid $!"
}
waitfor() { # desc timeout_s cmd...
  local d=$1 t=$2 i; shift 2
  for i in $(seq 1 $((t*2))); do "$@" >/dev/null 2>&1 && { echo "$d ready (${i}x0.5s)"; return 0; }; sleep 0.5; done
  echo "TIMEOUT waiting for $d"; return 1
}
stop() { # name
  local n=$1 p i; [ -f $R/$n.pid ] || return 0; p=$(cat $R/$n.pid)
  kill $p 2>/dev/null; for i in $(seq 1 40); do kill -0 $p 2>/dev/null || break; sleep 0.25; done
  kill -9 $p 2>/dev/null; rm -f $R/$n.pid; echo "stopped $n ($p)"
}
configs() {
  mkdir -p $K/containerd $K/cni/net.d $K/kubelet $L/runsc
  cat > $K/containerd/config.toml <<EOC
version = 3
root = "$K/containerd/root"
state = "$K/containerd/state"
[grpc]
  address = "$R/containerd.sock"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.10"
[plugins."io.containerd.cri.v1.runtime"]
  # this VM's root lacks CAP_SYS_RESOURCE: clamp oom_score_adj (-998 pause / -997 Guaranteed) to containerd's own
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$K/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "$R/runc"
        SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$K/containerd/runsc.toml"
EOC
  cat > $K/containerd/runsc.toml <<EOC
binary_name = "$B/runsc"
root = "$R/runsc"
# net-raw: without it runsc strips CAP_NET_RAW from every container, and the pod firewall's init container
# needs a raw socket to program gVisor's netstack iptables (box containers drop NET_RAW; docs/DRIVERS.md).
[runsc_config]
  net-raw = "true"
EOC
  cat > $K/cni/net.d/10-bridge.conflist <<EOC
{"cniVersion": "0.4.0", "name": "k8s-local", "plugins": [
  {"type": "bridge", "bridge": "k8sbr0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$K/cni/ipam", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOC
  cat > $K/kubelet/config.yaml <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: Webhook}
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$R/containerd.sock
failSwapOn: false
failCgroupV1: false
resolvConf: /etc/resolv.conf
podLogsDir: $K/kubelet/pod-logs
volumePluginDir: $K/kubelet/volume-plugins
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "256Mi", nodefs.inodesFree: "1%", imagefs.available: "256Mi"}
EOC
}
up() {
  [ -f $R/sysctl.orig ] || sysctl -e vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward > $R/sysctl.orig
  ip addr show dev lo | grep -q " $NODE_IP/32" || ip addr add $NODE_IP/32 dev lo   # stable non-loopback node IP
  sysctl -qw net.ipv4.ip_forward=1
  $HERE/pki.sh $P $NODE $NODE_IP
  configs
  PATH=$B:$PATH start containerd $B/containerd --config $K/containerd/config.toml   # PATH: finds containerd-shim-runsc-v1
  local E=$B/etcd; [ -x $E ] || E=/usr/bin/etcd
  start etcd $E --name k8s --data-dir $K/etcd-data --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster k8s=http://127.0.0.1:2380 \
    --listen-metrics-urls http://127.0.0.1:2381
  waitfor containerd 30 $B/ctr -a $R/containerd.sock version
  for t in $K/images/*.tar; do $B/ctr -a $R/containerd.sock -n k8s.io images import $t >/dev/null && echo "imported $t"; done
  waitfor etcd 30 curl -sf http://127.0.0.1:2379/health
  start kube-apiserver $B/kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=127.0.0.1 --secure-port=6443 --advertise-address=$NODE_IP \
    --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key --client-ca-file=$P/ca.crt \
    --kubelet-client-certificate=$P/apiserver-kubelet-client.crt --kubelet-client-key=$P/apiserver-kubelet-client.key \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
    --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --allow-privileged=true --cert-dir=$K/apiserver-certs --profiling=false
  waitfor kube-apiserver 120 curl -sf --cacert $P/ca.crt --cert $P/admin.crt --key $P/admin.key https://127.0.0.1:6443/readyz
  start kube-controller-manager $B/kube-controller-manager --kubeconfig=$P/kube-controller-manager.kubeconfig \
    --authentication-kubeconfig=$P/kube-controller-manager.kubeconfig --authorization-kubeconfig=$P/kube-controller-manager.kubeconfig \
    --bind-address=127.0.0.1 --leader-elect=false --service-account-private-key-file=$P/sa.key --root-ca-file=$P/ca.crt \
    --use-service-account-credentials=true --cluster-signing-cert-file=$P/ca.crt --cluster-signing-key-file=$P/ca.key \
    --service-cluster-ip-range=10.96.0.0/16 --profiling=false --flex-volume-plugin-dir=$K/kcm-flexvolume
  start kube-scheduler $B/kube-scheduler --kubeconfig=$P/kube-scheduler.kubeconfig \
    --authentication-kubeconfig=$P/kube-scheduler.kubeconfig --authorization-kubeconfig=$P/kube-scheduler.kubeconfig \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
  start kubelet $B/kubelet --config=$K/kubelet/config.yaml --kubeconfig=$P/kubelet.kubeconfig \
    --root-dir=$K/kubelet/root --hostname-override=$NODE --node-ip=$NODE_IP
  waitfor "node $NODE Ready" 120 sh -c "$B/kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
  waitfor "serviceaccount default/default" 60 $B/kubectl get sa default -n default
  [ -x $B/runsc ] && printf 'apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: gvisor}\nhandler: runsc\n' | $B/kubectl apply -f - >/dev/null && echo "RuntimeClass gvisor created"
  echo "KUBECONFIG=$KUBECONFIG"
}
down() {
  if [ -f $R/kube-apiserver.pid ] && [ -f $R/kubelet.pid ]; then   # let kubelet tear pods down (netns, veth, IPAM)
    timeout 90 $B/kubectl delete pods --all -A --grace-period=1 --wait=true >/dev/null 2>&1 || echo "pod deletion incomplete"
  fi
  for n in kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop $n; done
  if [ -f $R/containerd.pid ]; then   # anything kubelet left behind
    local C="$B/ctr -a $R/containerd.sock -n k8s.io" c
    for c in $($C tasks ls -q 2>/dev/null); do $C tasks kill -s SIGKILL $c >/dev/null 2>&1; done; sleep 1
    for c in $($C containers ls -q 2>/dev/null); do $C tasks delete -f $c >/dev/null 2>&1; $C containers delete $c >/dev/null 2>&1; done
    stop containerd
  fi
  # kubelet bind-mounts its root dir (rshared); gVisor shim bind-mounts a null netns
  awk -v k="$K/" 'index($2, k) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
  for h in /sys/fs/cgroup/*/kubepods; do [ -d $h ] && find $h -depth -type d -exec rmdir {} + 2>/dev/null; done
  ip link del k8sbr0 2>/dev/null; ip addr del $NODE_IP/32 dev lo 2>/dev/null
  for t in filter nat mangle; do   # chains kubelet creates (KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT)
    iptables -t $t -D INPUT -j KUBE-FIREWALL 2>/dev/null; iptables -t $t -D OUTPUT -j KUBE-FIREWALL 2>/dev/null
    for ch in $(iptables -t $t -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/{print $2}'); do iptables -t $t -F $ch; done
    for ch in $(iptables -t $t -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/{print $2}'); do iptables -t $t -X $ch; done
  done
  [ -f $R/sysctl.orig ] && sed 's/ //g' $R/sysctl.orig | xargs -r sysctl -qw && rm -f $R/sysctl.orig
  for s in /run/containerd/s/*; do [ -S $s ] && ! ss -xl | grep -q "$s" && rm -f $s; done 2>/dev/null   # stale shim sockets
  rmdir /run/containerd/s /run/containerd 2>/dev/null
  # kubelet hard-codes these (not configurable); remove if empty
  find /var/log/containers -maxdepth 1 -type l -lname "$K/*" -delete 2>/dev/null; rm -f /run/nri/nri.sock; rmdir /run/nri 2>/dev/null
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock; rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers 2>/dev/null
  rm -rf /var/lib/cni/results; rmdir /var/lib/cni 2>/dev/null
  true
}
status() {
  [ -f $R/kube-apiserver.pid ] && kill -0 $(cat $R/kube-apiserver.pid) 2>/dev/null || return 1
  curl -sf --max-time 5 --cacert $P/ca.crt --cert $P/admin.crt --key $P/admin.key https://127.0.0.1:6443/readyz >/dev/null || return 1
  $B/kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True
}
case ${1:-} in up) up;; down) down;; status) status;; *) echo "usage: $0 up|down|status"; exit 2;; esac
