#!/usr/bin/env bash
# Regenerates api/gen from api/proto with pinned plugin versions.
# Usage: scripts/gen-proto.sh [OUTDIR]   (default: api/gen)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-api/gen}"
tools="$PWD/.tools"
mkdir -p "$tools"
PROTOC_GEN_GO_VERSION=v1.36.10
PROTOC_GEN_CONNECT_GO_VERSION=v1.19.1
if [[ ! -x "$tools/protoc-gen-go" ]] || ! go version -m "$tools/protoc-gen-go" | grep -q "$PROTOC_GEN_GO_VERSION"; then
  GOBIN="$tools" GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
fi
if [[ ! -x "$tools/protoc-gen-connect-go" ]] || ! go version -m "$tools/protoc-gen-connect-go" | grep -q "$PROTOC_GEN_CONNECT_GO_VERSION"; then
  GOBIN="$tools" GOFLAGS= go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$PROTOC_GEN_CONNECT_GO_VERSION"
fi
command -v protoc >/dev/null || { echo "protoc missing: apt-get install protobuf-compiler" >&2; exit 1; }
mkdir -p "$out"
mapfile -t protos < <(cd api/proto && find . -name '*.proto' | sed 's|^\./||' | sort)
PATH="$tools:$PATH" protoc -I api/proto \
  --go_out="$out" --go_opt=paths=source_relative \
  --connect-go_out="$out" --connect-go_opt=paths=source_relative \
  "${protos[@]}"
# The TypeScript SDK's code from the same protos (sdk/ts/src/gen), when
# regenerating in place (scripts/check-gen.sh checks it on its own).
if [[ -z "${1:-}" ]]; then
  (cd sdk/ts && { [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error; } && npm run -s gen)
  # The dashboard's committed build embeds that code (scripts/check-ui.sh).
  (cd web && { [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error; } && npm run -s build)
fi
