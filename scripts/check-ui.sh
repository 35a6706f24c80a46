#!/usr/bin/env bash
# Fails when the dashboard's committed build (internal/ui/dist, embedded in
# the daemon so that `go build` needs no npm) is not what web/'s sources
# build to: `npm ci` with web/package-lock.json, a type check, and a Vite
# build into a scratch directory, compared file by file. Fix: make ui.
set -euo pipefail
cd "$(dirname "$0")/../web"
npm ci --no-audit --no-fund --loglevel=error
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
npx tsc --noEmit -p tsconfig.json
npx vite build --logLevel error --outDir "$tmp/dist"
if ! diff -r "$tmp/dist" ../internal/ui/dist >/dev/null; then
  diff -r "$tmp/dist" ../internal/ui/dist | head -20 >&2
  echo "check-ui: internal/ui/dist is stale; run make ui and commit the result" >&2
  exit 1
fi
echo "check-ui: internal/ui/dist is up to date"
