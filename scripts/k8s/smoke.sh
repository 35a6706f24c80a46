#!/bin/bash
# End-to-end check of what a sandbox driver needs: create Pod (scheduler path), Running, exec (+stdin),
# port-forward, pod-IP reachability, delete; same with RuntimeClass gvisor (runsc) if available.
set -uo pipefail
K=${K:-/var/cache/sbx-k8s}; B=$K/bin; export KUBECONFIG=$K/pki/admin.kubeconfig KUBECACHEDIR=$K/kubectl-cache
kc() { $B/kubectl "$@"; }
fail=0; ok() { echo "PASS $*"; }; bad() { echo "FAIL $*"; fail=1; }
now() { date +%s.%N; }; el() { printf '%.2fs' $(echo "$(now) - $1" | bc); }
run_case() { # name runtimeClass(or empty) expect_portforward(1/0)
  local n=$1 rc=$2 pf=$3 t port=$((18000 + RANDOM % 1000))
  kc apply -f - >/dev/null <<EOP
apiVersion: v1
kind: Pod
metadata: {name: $n, labels: {app: smoke}}
spec:
  ${rc:+runtimeClassName: $rc}
  terminationGracePeriodSeconds: 2
  containers:
  - {name: agent, image: docker.io/library/busybox:local, imagePullPolicy: Never,
     command: [httpd, -f, -p, "8080", -h, /www], ports: [{containerPort: 8080}]}
EOP
  t=$(now); kc wait --for=condition=Ready pod/$n --timeout=120s >/dev/null && ok "$n Ready in $(el $t)" || { bad "$n not Ready"; kc describe pod $n | tail -5; return; }
  [ "$(kc exec $n -- sh -c 'echo exec-ok')" = exec-ok ] && ok "$n exec" || bad "$n exec"
  [ "$(echo stdin-ok | kc exec -i $n -- cat)" = stdin-ok ] && ok "$n exec stdin" || bad "$n exec stdin"
  ip=$(kc get pod $n -o jsonpath='{.status.podIP}')
  [ "$(curl -s --max-time 5 http://$ip:8080/)" = hello-from-pod ] && ok "$n pod IP $ip:8080" || bad "$n pod IP"
  kc port-forward pod/$n $port:8080 >/dev/null 2>&1 & local pfp=$! r=""
  for i in $(seq 1 20); do r=$(curl -s --max-time 2 http://127.0.0.1:$port/) && [ -n "$r" ] && break; sleep 0.5; done
  kill $pfp 2>/dev/null; wait $pfp 2>/dev/null
  if [ "$r" = hello-from-pod ]; then ok "$n port-forward"; elif [ $pf = 0 ]; then echo "EXPECTED-FAIL $n port-forward (known gVisor limitation)"; else bad "$n port-forward"; fi
  t=$(now); kc delete pod $n --wait=true --timeout=60s >/dev/null && ok "$n deleted in $(el $t)" || bad "$n delete"
}
run_case smoke-runc "" 1
[ -x $B/runsc ] && run_case smoke-gvisor gvisor 0
[ $fail = 0 ] && echo "SMOKE OK" || { echo "SMOKE FAILED"; exit 1; }
