#!/usr/bin/env bash
# `make bench`: latencies of sbx next to floors measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -ne 0 ]]; then echo "make bench needs root" >&2; exit 1; fi
CGO_ENABLED=0 go build -o bin/sbx-bench ./cmd/sbx-bench
bin/sbx-bench -agent bin/sbx-agent "$@"
