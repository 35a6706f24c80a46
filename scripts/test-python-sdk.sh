#!/usr/bin/env bash
# Runs the Python SDK's tests (sdk/python/tests) against a real daemon.
#
# With $SBX_ADDR pointing at a running daemon the tests use it; otherwise (or
# when nothing answers there, e.g. the Makefile's default address) they start
# bin/sbx serve themselves on a free port (needs root; built here if missing). Uses Debian's /usr/bin/python3 with python3-pytest (installed with
# apt-get if missing); the SDK is taken from sdk/python via PYTHONPATH.
# Extra arguments go to pytest, e.g. scripts/test-python-sdk.sh -k exec -x
set -euo pipefail
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
if [[ ! -x $PY ]]; then
  echo "test-python-sdk: $PY is missing (apt-get install python3)" >&2
  exit 1
fi
if ! $PY -c 'import pytest' >/dev/null 2>&1; then
  echo "test-python-sdk: installing python3-pytest"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pytest >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pytest >/dev/null
  fi
fi

if [[ ! -x bin/sbx || ! -x bin/sbx-agent ]]; then
  make build
fi
if [[ -z ${SBX_ADDR:-} && $(id -u) -ne 0 ]]; then
  echo "test-python-sdk: not root and SBX_ADDR unset: the daemon tests will be skipped" >&2
fi

export PYTHONPATH="$PWD/sdk/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
set +e
$PY -m pytest -q -p no:cacheprovider sdk/python/tests "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "test-python-sdk: no tests were collected" >&2
  exit 1
fi
exit $rc
