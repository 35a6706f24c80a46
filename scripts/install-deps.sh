#!/usr/bin/env bash
# Installs what building, running and testing sbx needs on a Debian-like
# machine: system packages through apt (only when missing) and pinned Go
# tools into .tools/. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# ruby, node-typescript and r-base-core let the tests run code in those languages (run_code);
# python3-plotly and python3-seaborn (with pandas: ~10 MB of .debs, ~85 MB installed: plotly 44 MB, pandas 38 MB;
# no recommends) let them test plot capture. nftables (the nft command) lets a test read set elements back.
# chromium is the browser the dashboard's end-to-end test drives (scripts/test-web-ui.sh).
for pkg in runc crun protobuf-compiler iproute2 python3 python3-pytest procps e2fsprogs python3-matplotlib python3-pip \
  python3-plotly python3-seaborn \
  git ruby node-typescript r-base-core default-jdk-headless g++ nftables chromium; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages ${need[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
  if [[ -x /usr/local/go/bin/go ]]; then export PATH=/usr/local/go/bin:$PATH; else
    echo "install-deps: Go is missing (install Go 1.26 to /usr/local/go)" >&2; exit 1; fi
fi

tools="$PWD/.tools"
mkdir -p "$tools"
STATICCHECK_VERSION=v0.8.2
if [[ ! -x "$tools/staticcheck" ]] || ! go version -m "$tools/staticcheck" | grep -q "$STATICCHECK_VERSION"; then
  echo "install-deps: installing staticcheck $STATICCHECK_VERSION"
  GOBIN="$tools" GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi

# gVisor's runsc, for the gvisor runtime (built from source at a pinned version).
scripts/install-runsc.sh
