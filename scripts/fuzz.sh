#!/usr/bin/env bash
# Runs every Go fuzz target (func FuzzXxx in *_test.go) for FUZZTIME each,
# one at a time with one worker (-parallel 1), so that it never takes the
# whole machine. `make fuzz` runs it with FUZZTIME=60s; `make test` with
# FUZZTIME=3s (plain `go test` already runs every seed corpus under
# testdata/fuzz/). A crash stops the run: the failing input is written to
# testdata/fuzz/<FuzzName>/ in the target's package; commit it with the fix.
#
#   FUZZTIME=5m scripts/fuzz.sh                 # every target, 5 minutes each
#   scripts/fuzz.sh FuzzDNSQuery FuzzExtract    # targets whose names match
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
FUZZTIME=${FUZZTIME:-60s}

# module dir, package dir, target name for every target.
targets() {
  git ls-files '*_test.go' | xargs grep -H '^func Fuzz[A-Za-z0-9_]*(f \*testing.F)' | while IFS=: read -r file line; do
    name=${line#func }
    name=${name%%(*}
    dir=$(dirname "$file")
    mod=.
    case $dir in
      api|api/*) mod=api dir=${dir#api}; dir=${dir#/} ;;
      sdk/go|sdk/go/*) mod=sdk/go dir=${dir#sdk/go}; dir=${dir#/} ;;
    esac
    echo "$mod ./${dir:-.} $name"
  done
}

failed=0
while read -r mod pkg name; do
  if [ $# -gt 0 ]; then
    match=0
    for want in "$@"; do [[ $name == *"$want"* ]] && match=1; done
    [ $match = 1 ] || continue
  fi
  echo "fuzz: $name in $pkg ($FUZZTIME)"
  if ! (cd "$mod" && go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -parallel 1 "$pkg" >/tmp/sbx-fuzz.$$.log 2>&1); then
    cat /tmp/sbx-fuzz.$$.log
    failed=1
  fi
done < <(targets)
rm -f /tmp/sbx-fuzz.$$.log
exit $failed
