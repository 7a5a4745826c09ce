#!/usr/bin/env bash
# README command 2: install everything (once) and run the tests (lint, unit, flow, real-model integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$code"
