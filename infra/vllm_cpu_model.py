"""The embedded model's GGUF file in Hugging Face format, for vLLM (which serves Hugging Face checkpoints, not GGUF).

Run by infra/vllm_cpu.sh with the vLLM venv's Python, offline:  python infra/vllm_cpu_model.py GGUF OUT_DIR
transformers reads GGUF files of the Qwen2 architecture: it dequantizes the Q4_K_M weights (so vLLM serves the
same weights the embedded llama.cpp server does, stored as float32, which holds every dequantized value exactly:
bfloat16's 8-bit mantissa would round them) and rebuilds the tokenizer and its chat template from the file's
metadata. The result is written to OUT_DIR.partial and renamed to OUT_DIR when complete, with a marker naming the
GGUF's sha256, so an interrupted conversion is never mistaken for a model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

MARKER = ".ragledger-complete"
FORMAT = "hf-float32-1"  # what the marker promises; a change here converts again


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def main(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file; nothing from a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    started = time.monotonic()
    digest = sha256(gguf)
    marker = out / MARKER
    if marker.exists() and json.loads(marker.read_text()) == {"gguf": str(gguf), "gguf_sha256": digest, "format": FORMAT}:
        print(f"model ready: {out}")
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    print(f"converting {gguf.name} to Hugging Face format (dequantizing; 1-3 minutes) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise SystemExit(f"error: {gguf} carries no chat template; vLLM's chat completions need one")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # the weights are dequantized on load; what is left of the GGUF "quantization" is metadata that makes
    # save_pretrained refuse (not serializable) and would make vLLM look for GGUF kernels
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / MARKER).write_text(json.dumps({"gguf": str(gguf), "gguf_sha256": digest, "format": FORMAT}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    print(f"model ready: {out} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python infra/vllm_cpu_model.py GGUF OUT_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
