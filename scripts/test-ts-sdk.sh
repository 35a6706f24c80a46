#!/usr/bin/env bash
# Builds the TypeScript SDK (sdk/ts), checks its generated code against
# api/proto, packs it with `npm pack` and runs its tests (sdk/ts/test, with
# Node's test runner) against the packed tarball installed in a scratch
# project, with a real daemon: $SBX_ADDR/$SBX_TOKEN when one answers there,
# else bin/sbx serve started by the tests (needs root; built here if
# missing). Needs node >= 20 and npm (the npm registry for `npm ci`).
# Extra arguments go to node --test, e.g. --test-name-pattern=files
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

command -v node >/dev/null || { echo "test-ts-sdk: node is missing (>= 20)" >&2; exit 1; }
major=$(node -p 'process.versions.node.split(".")[0]')
if (( major < 20 )); then
  echo "test-ts-sdk: node $(node --version) is too old: want >= 20" >&2
  exit 1
fi
if [[ ! -x bin/sbx || ! -x bin/sbx-agent ]]; then
  make build
fi

cd sdk/ts
npm ci --no-audit --no-fund --loglevel=error
npm run -s check-gen
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
npm pack --silent --pack-destination "$tmp" >/dev/null
tgz=$(ls "$tmp"/*.tgz)

# A scratch project that depends on the tarball (as a user's would) and on
# the MCP SDK's client at the version sdk/ts pins.
mcp_version=$(node -p 'require("./package-lock.json").packages["node_modules/@modelcontextprotocol/sdk"].version')
mkdir "$tmp/app"
cp -r test "$tmp/app/test"
cat >"$tmp/app/package.json" <<JSON
{"name": "sbx-ts-sdk-test", "private": true, "type": "module"}
JSON
(cd "$tmp/app" && npm install --no-audit --no-fund --loglevel=error --save-exact "$tgz" "@modelcontextprotocol/sdk@$mcp_version")

cd "$tmp/app"
SBX_REPO="$repo" node --test --test-concurrency=1 "$@" test/
