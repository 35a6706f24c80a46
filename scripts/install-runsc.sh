#!/usr/bin/env bash
# Builds gVisor's runsc into .tools/runsc from the Go module proxy at a pinned
# pseudo-version (no prebuilt download). Safe to run repeatedly: it does
# nothing when .tools/runsc is already that version.
#
# CGO_ENABLED=0 is required: a cgo build makes every sandbox fail with
# "fork/exec /proc/self/exe: no such file or directory". The version is pinned
# because the proxy refuses branch queries and newer builds fetch helper
# binaries from a bucket these machines cannot reach.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}

if ! command -v go >/dev/null; then
  if [[ -x /usr/local/go/bin/go ]]; then export PATH=/usr/local/go/bin:$PATH; else
    echo "install-runsc: Go is missing (install Go 1.26 to /usr/local/go)" >&2; exit 1; fi
fi

tools="$PWD/.tools"
mkdir -p "$tools"
# No grep -q or head in pipelines: under pipefail the writer's SIGPIPE fails them.
if [[ -x "$tools/runsc" ]] && go version -m "$tools/runsc" 2>/dev/null | grep "$RUNSC_VERSION" >/dev/null; then
  exit 0
fi
echo "install-runsc: building runsc $RUNSC_VERSION (CGO_ENABLED=0, about a minute)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" GOFLAGS= CGO_ENABLED=0 go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
install -m 0755 "$tmp/runsc" "$tools/runsc"
version=$("$tools/runsc" --version)
echo "${version%%$'\n'*}"
