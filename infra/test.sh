#!/usr/bin/env bash
# README command 2: install everything (once) and run the tests (lint, unit, flow, real-model integration).
#   bash infra/test.sh [PYTEST ARGS]          everything, the slow reliability and real-model tests included
#                                             (benchmarks are skipped unless --benchmark-only); .ci/run runs this
#   bash infra/test.sh --fast [PYTEST ARGS]   the fast tier, for the edit-test loop (under 3 minutes on 2 cores):
#                                             ruff, then pytest -m "not integration and not slow"; it uses the
#                                             existing .venv as it is (no install check, no model start)
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
if [ "$fast" -eq 1 ] && .venv/bin/python -c "import ragledger, pytest" >/dev/null 2>&1; then
  echo "== fast tier (the existing .venv; bash infra/test.sh without --fast installs and runs everything)"
else
  bash infra/setup.sh
  bash infra/browser_deps.sh
fi
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
markers=()
if [ "$fast" -eq 1 ]; then
  markers=(-m "not integration and not slow")
fi
set +e
.venv/bin/python -m pytest "${markers[@]}" "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$code"
