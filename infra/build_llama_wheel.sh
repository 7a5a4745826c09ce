#!/usr/bin/env bash
# Build (once) a llama-cpp-python wheel for the embedded LLM server and print its path.
# Why a custom build: the default native build (-march=native) segfaults on the first request on this
# CPU family; an explicit feature set works. Two variants, chosen from /proc/cpuinfo:
#   avx512: AVX-512 F/BW/VL/VBMI/VNNI/BF16 (no AMX) where the CPU has them — prompt evaluation of the
#           0.5B model measured 155-170 tok/s on 2 cores against 120 tok/s for the avx2 build;
#   avx2:   AVX2/FMA/F16C/BMI2, any x86-64-v3 machine.
# Every optional instruction set is switched on only when /proc/cpuinfo lists it: AVX-VNNI (VEX, flag avx_vnni)
# is not implied by AVX512-VNNI — AMD Zen 4 has the second, not the first, and a build with GGML_AVX_VNNI died
# there with SIGILL on the first request.
# The wheel is cached outside the repo per exact flag set, so set-up reuses it (a build takes ~5-13 min) and a
# change of flags never picks up a stale wheel.
set -euo pipefail
VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
PY="${PYTHON:-python3}"
has() { grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | grep -qw "$1"; }
VARIANT="${RAGLEDGER_LLAMA_VARIANT:-}"
if [ -z "$VARIANT" ]; then
  VARIANT=avx2
  if has avx512f && has avx512bw && has avx512vl && has avx512_vnni && has avx512vbmi && has avx512_bf16; then
    VARIANT=avx512
  fi
fi
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
case "$VARIANT" in
  avx512)
    FLAGS="$FLAGS -DGGML_AVX512=ON"
    for pair in AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16 AVX_VNNI:avx_vnni; do
      if has "${pair#*:}"; then FLAGS="$FLAGS -DGGML_${pair%%:*}=ON"; else FLAGS="$FLAGS -DGGML_${pair%%:*}=OFF"; fi
    done ;;
  avx2) FLAGS="$FLAGS -DGGML_AVX512=OFF" ;;
  *) echo "error: RAGLEDGER_LLAMA_VARIANT must be avx2 or avx512, got '$VARIANT'" >&2; exit 2 ;;
esac
FLAGS="$FLAGS -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=ON -DLLAMA_CURL=OFF"
FLAGS_ID=$(printf '%s' "$FLAGS" | sha256sum | cut -c1-10)
CACHE="${RAGLEDGER_WHEEL_CACHE:-$HOME/.cache/ragledger/wheels}/$VARIANT-$FLAGS_ID"
mkdir -p "$CACHE"
existing=$(ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -n "$existing" ]; then echo "$existing"; exit 0; fi
echo "building llama-cpp-python $VERSION ($VARIANT) from source (one time, ~5-13 min on 2 cores)..." >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$PY" -m pip wheel --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$VERSION" >&2
mv "$tmp"/llama_cpp_python-*.whl "$CACHE"/
ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl | head -n1
