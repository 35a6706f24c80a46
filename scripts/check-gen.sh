#!/usr/bin/env bash
# Fails when api/gen is not what scripts/gen-proto.sh makes from api/proto.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
./scripts/gen-proto.sh "$tmp"
if ! diff -r "$tmp" api/gen >/dev/null; then
  diff -r "$tmp" api/gen | head -40 >&2
  echo "check-gen: api/gen is stale; run scripts/gen-proto.sh and commit the result" >&2
  exit 1
fi
echo "check-gen: api/gen is up to date"
# The TypeScript SDK's generated code (sdk/ts/src/gen) too.
(cd sdk/ts && { [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error; } && npm run -s check-gen)
