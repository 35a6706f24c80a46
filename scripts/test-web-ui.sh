#!/usr/bin/env bash
# The dashboard in a real browser: checks internal/ui/dist against web/
# (scripts/check-ui.sh), then runs web/test/e2e.mjs, Playwright
# (playwright-core, pinned in web/package-lock.json) driving Debian's
# chromium headless ($CHROMIUM, default /usr/bin/chromium; no browser
# download) against a real daemon: $SBX_ADDR/$SBX_TOKEN when one answers
# there, else bin/sbx serve started by the test (needs root). Prints the
# first-load time and the bundle size. SCREENSHOTS=DIR saves a screenshot of
# each page (make screenshots: docs/ui).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
command -v node >/dev/null || { echo "test-web-ui: node is missing (>= 20)" >&2; exit 1; }
chromium=${CHROMIUM:-/usr/bin/chromium}
if [[ ! -x $chromium ]]; then
  echo "test-web-ui: no chromium at $chromium: apt-get install -y chromium, or set CHROMIUM" >&2
  exit 1
fi
./scripts/check-ui.sh
if [[ ! -x bin/sbx || ! -x bin/sbx-agent ]]; then
  make build
fi
cd web
SBX_REPO="$repo" CHROMIUM="$chromium" node test/e2e.mjs
