#!/usr/bin/env bash
# Build (once) a llama-cpp-python wheel for the embedded LLM server and print its path.
# Why a custom build: the default native build uses AMX instructions on this CPU family and
# segfaults on the first request; a conservative, explicit AVX2 feature set runs on any x86-64-v3
# machine. The wheel is cached outside the repo so set-up reuses it (a rebuild takes ~9-13 min).
set -euo pipefail
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
CACHE="${RAGLEDGER_WHEEL_CACHE:-$HOME/.cache/ragledger/wheels}"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE"
existing=$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$existing" ]; then echo "$existing"; exit 0; fi
echo "building llama-cpp-python $VERSION from source (one time, ~10 min on 2 cores)..." >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$PY" -m pip wheel --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$VERSION" >&2
mv "$tmp"/llama_cpp_python-*.whl "$CACHE"/
ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -n1
