#!/usr/bin/env bash
# README command 2: install everything (once) and run the tests (lint, unit, flow, real-model integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
set +e
# crash/resume and 4-way concurrency tests are marked slow: run them with `bash infra/test.sh -m slow`
.venv/bin/python -m pytest -m "not slow" "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$code"
