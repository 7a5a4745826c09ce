#!/usr/bin/env bash
# README command 2: install everything (once) and run the tests (lint, unit, flow, real-model integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
bash infra/browser_deps.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
set +e
# everything, the slow reliability tests included (benchmarks are skipped unless --benchmark-only);
# a quicker loop while developing: bash infra/test.sh -m "not slow"
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$code"
