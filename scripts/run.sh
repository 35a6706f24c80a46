#!/usr/bin/env bash
# `make run`: starts the sbx daemon in the background (unless one already
# answers at $SBX_ADDR) and runs the quickstart against it.
# `scripts/run.sh stop` stops a daemon started this way.
set -euo pipefail
cd "$(dirname "$0")/.."
addr="${SBX_ADDR:-127.0.0.1:7777}"
state="$PWD/.sbx"
data="${DATA_DIR:-$state/data}"
pidfile="$state/daemon.pid"
mkdir -p "$state"

if [[ "${1:-}" == "stop" ]]; then
  if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")"; rm -f "$pidfile"; echo "sbx daemon stopped (sandboxes keep running until their timeout or the next start)"
  else
    echo "no daemon started by make run is running"
  fi
  exit 0
fi

healthy() { curl -fsS "http://$addr/healthz" >/dev/null 2>&1 || bin/sbx --addr "$addr" version >/dev/null 2>&1; }

if ! healthy; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "sbx serve needs root (namespaces, cgroups, mounts); run make run as root" >&2
    exit 1
  fi
  echo "starting sbx daemon on $addr (data in $data, log in $state/daemon.log)"
  nohup bin/sbx serve --listen "$addr" --data-dir "$data" >"$state/daemon.log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 1 100); do
    healthy && break
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "the daemon exited; its log:" >&2; cat "$state/daemon.log" >&2; exit 1
    fi
    sleep 0.1
  done
  healthy || { echo "the daemon did not come up; see $state/daemon.log" >&2; exit 1; }
fi
bin/sbx --addr "$addr" version
echo
CGO_ENABLED=0 go run ./examples/quickstart -addr "$addr"
echo
echo "The daemon keeps running at $addr; its web dashboard is at http://${addr%:*}:$(( ${addr##*:} + 1 ))/ui/"
echo "(its own port: sandboxes' pages proxied on $addr cannot reach it). Try:"
echo "  export SBX_ADDR=$addr"
echo "  bin/sbx run -- python3 -c 'import sys; print(sys.version)'"
echo "  bin/sbx run --runtime gvisor -- dmesg        # the same on gVisor's kernel (scripts/install-runsc.sh builds runsc)"
echo "  bin/sbx info                                 # both tiers: health, capabilities, the default"
echo "  id=\$(bin/sbx create --name demo --memory 256M) && bin/sbx exec -it demo -- bash"
echo "Stop it with: make stop"
