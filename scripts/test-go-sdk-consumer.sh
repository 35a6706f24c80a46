#!/usr/bin/env bash
# Proves that a Go module outside this repository can `go get` the Go SDK
# the way a real user would: the SDK (sdk/go) and the API (api/) are
# modules of their own, published by the tags sdk/go/vX.Y.Z and api/vX.Y.Z,
# and the SDK's go.mod requires api at a version (its replace of ../../api
# applies only inside this repository). This builds a file-based GOPROXY
# holding both modules at $VERSION, made from the working tree, and in a
# fresh module in a temp dir runs `go get` and `go build` with GOFLAGS=-mod=mod
# and the module cache as the proxy for everything else: offline, no
# replace, no workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
VERSION=$(sed -n 's#^\tgithub.com/sbxdev/sbx/api \(v[^ ]*\)$#\1#p' sdk/go/go.mod)
[ -n "$VERSION" ] || { echo "sdk/go/go.mod does not require github.com/sbxdev/sbx/api at a version" >&2; exit 1; }
repo=$PWD
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
proxy=$work/proxy

# module DIR PATH: one module version in the proxy, from git's files in DIR.
module() {
  local dir=$1 path=$2 d=$proxy/$2/@v
  mkdir -p "$d"
  echo "$VERSION" >"$d/list"
  printf '{"Version":"%s","Time":"2026-01-01T00:00:00Z"}\n' "$VERSION" >"$d/$VERSION.info"
  cp "$dir/go.mod" "$d/$VERSION.mod"
  (cd "$repo" && git ls-files -co --exclude-standard -- "$dir") | python3 -c '
import sys, zipfile
dir, prefix, out = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(out, "w") as z:
    for f in sys.stdin.read().split("\n"):
        if f:
            z.write(f, prefix + "/" + f[len(dir) + 1:])
' "$dir" "$path@$VERSION" "$d/$VERSION.zip"
}
module api github.com/sbxdev/sbx/api
module sdk/go github.com/sbxdev/sbx/sdk/go

mkdir -p "$work/consumer"
cd "$work/consumer"
cat >go.mod <<'MOD'
module example.com/consumer

go 1.26
MOD
cat >main.go <<'GO'
package main

import (
	"fmt"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func main() {
	c := sbx.NewClient("127.0.0.1:7777")
	defer c.Close()
	fmt.Println(sbx.CreateOptions{Image: "alpine"}.Request().GetImage(), sbxv1.SandboxState_SANDBOX_STATE_RUNNING)
}
GO
# The module cache serves every other dependency; the sum database is off
# because it cannot be reached offline (a real user's go get checks it).
export GOFLAGS=-mod=mod GOWORK=off GOSUMDB=off GONOSUMDB= GOPRIVATE= \
  GOPROXY="file://$proxy,file://$(go env GOMODCACHE)/cache/download"
go get "github.com/sbxdev/sbx/sdk/go@$VERSION"
go build -o consumer .
got=$(./consumer)
[ "$got" = "alpine SANDBOX_STATE_RUNNING" ] || { echo "consumer printed $got" >&2; exit 1; }
grep -q "github.com/sbxdev/sbx/api $VERSION" go.mod || { echo "consumer's go.mod lacks api $VERSION:" >&2; cat go.mod >&2; exit 1; }
echo "go get github.com/sbxdev/sbx/sdk/go@$VERSION from a clean module: ok"
