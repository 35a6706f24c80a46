#!/usr/bin/env bash
# `make soak`: the long crash loop (integration/crashloop_test.go). Each run
# drives a random workload from SOAK_CLIENTS clients and kill -9s the daemon
# SOAK_ROUNDS times, mostly exactly inside creates, destroys, syncs and session
# creations (crash points), checking after every restart that every
# acknowledged sandbox, write, session and sync is intact and nothing leaked
# (networking is on, over a bridge, table and /24 of the run's own: address
# leases, namespaces, veths and firewall elements are checked too).
# Runs are repeated with fresh seeds until SOAK_DURATION (seconds) is spent
# (0: one run). SOAK_SEED replays one run. Needs root.
#
#   SOAK_ROUNDS=25 SOAK_CLIENTS=4 SOAK_MAX_BOXES=12 SOAK_DURATION=0 make soak
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then echo "make soak needs root" >&2; exit 1; fi
rounds=${SOAK_ROUNDS:-25}
clients=${SOAK_CLIENTS:-4}
maxboxes=${SOAK_MAX_BOXES:-12}
duration=${SOAK_DURATION:-0}
end=$(( $(date +%s) + duration ))
run=0
while :; do
	run=$((run + 1))
	seed=${SOAK_SEED:-$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')}
	echo "soak run $run: seed $seed, $rounds rounds, $clients clients (replay: SOAK_SEED=$seed)"
	log=$(mktemp /tmp/sbx-soak-XXXXXX.log)
	rc=0
	SBX_CRASH_SEED=$seed SBX_CRASH_ROUNDS=$rounds SBX_CRASH_CLIENTS=$clients SBX_CRASH_MAX_BOXES=$maxboxes \
		go test -count=1 -timeout 0 -run 'TestCrashLoop$' -v ./integration/ >"$log" 2>&1 || rc=$?
	if [[ $rc -ne 0 ]]; then
		cat "$log"
		echo "soak run $run failed (seed $seed; log $log)" >&2
		exit 1
	fi
	grep -v '^        time=' "$log" | grep -E 'crashloop_test|^          |^(---|ok)' || true
	rm -f "$log"
	if [[ -n ${SOAK_SEED:-} || $(date +%s) -ge $end ]]; then break; fi
done
