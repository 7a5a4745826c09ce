#!/usr/bin/env bash
# vLLM serving recipe for ragledger (needs an NVIDIA GPU; cannot run on the CPU-only dev machines).
#   pip install -c constraints.txt -e ".[vllm]"   then   bash infra/vllm_serve.sh
# The client side must match: configs/vllm.yaml sets model.name = $VLLM_MODEL and
# model.concurrency = $VLLM_MAX_SEQS (ragledger keeps at most that many requests in flight, which is what
# vLLM batches at once; more would only queue in the server, fewer would leave batch slots idle).
set -euo pipefail
VLLM_MODEL="${VLLM_MODEL:-Qwen/Qwen2.5-7B-Instruct}"   # any chat model vLLM serves; 7B fits one 24 GB GPU in bf16
VLLM_TP="${VLLM_TP:-1}"                                  # tensor parallel size = GPUs per replica (2 for a 14B on 24 GB cards)
VLLM_MAX_SEQS="${VLLM_MAX_SEQS:-64}"                    # max concurrent sequences per batch
VLLM_MAX_LEN="${VLLM_MAX_LEN:-8192}"                    # context: 20 passages x ~150 tokens + prompt fits in 4k; SuRe needs more
VLLM_PORT="${VLLM_PORT:-8000}"
VLLM_HOST="${VLLM_HOST:-127.0.0.1}"                      # beyond loopback it needs VLLM_API_KEY (core/exposure.py's rule)
case "$VLLM_HOST" in
  127.*|localhost|::1) ;;
  *) if [ -z "${VLLM_API_KEY:-}" ]; then
       echo "error: vLLM on $VLLM_HOST would accept anyone on the network: set VLLM_API_KEY (vLLM reads it; clients" \
            "name a variable holding it in model.api_key_env) (or bind 127.0.0.1)" >&2
       exit 2
     fi ;;
esac
# --generation-config vllm: without it vLLM applies the checkpoint's generation_config.json to every sampling field a
# request leaves out (Qwen2.5-7B-Instruct's: top_k 20, repetition_penalty 1.05, ...); ragledger's requests set only
# temperature, top_p, max_tokens and seed, and mean the rest at their neutral values (tests/test_vllm_server.py)
exec vllm serve "$VLLM_MODEL" \
  --host "$VLLM_HOST" --port "$VLLM_PORT" \
  --tensor-parallel-size "$VLLM_TP" \
  --max-num-seqs "$VLLM_MAX_SEQS" \
  --max-model-len "$VLLM_MAX_LEN" \
  --gpu-memory-utilization 0.90 \
  --enable-prefix-caching \
  --generation-config vllm \
  --seed 0
