"""all-MiniLM-L6-v2 through ONNX Runtime, for encoding a whole corpus (the dense index).

sentence-transformers runs the model in PyTorch eagerly; ONNX Runtime runs the same graph about 1.6x faster on
2 CPU cores (measured: 34 vs 54 SQuAD paragraphs per second) with the same vectors (cosine 1.000000 to
sentence-transformers' on 1,024 paragraphs, `tests/test_retrievers.py`). The graph is exported once per machine
from the bundled weights into the cache home, written atomically (ragledger.atomic) so concurrent exports agree.
Mean pooling over the attention mask and L2 normalization as the model's sentence-transformers config does.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from ragledger.atomic import atomic_path
from ragledger.paths import cache_home
from ragledger.semantic import embedding_model

ONNX_VERSION = "minilm-l6-v2-onnx-1"  # the exported graph's file name: a new export recipe writes a new file
BATCH = 32  # measured: larger batches pad more and gain nothing on 2 cores


def _export(target: Path) -> None:
    import torch

    model = embedding_model()
    bert, tokenizer = model[0].auto_model.eval(), model.tokenizer

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    sample = tokenizer(["a", "b c"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with atomic_path(target) as tmp:  # concurrent exports each rename a whole file into place
        torch.onnx.export(LastHidden(), tuple(sample[n] for n in names), str(tmp), input_names=names,
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]})


@functools.lru_cache(maxsize=1)
def _session():
    import onnxruntime as ort

    path = cache_home() / "models" / f"{ONNX_VERSION}.onnx"
    if not path.exists():
        _export(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def encode(texts: list[str]) -> np.ndarray:
    """Unit-norm float32 embeddings of texts, in order; longest first in batches of BATCH so padding stays small."""
    model = embedding_model()
    tokenizer, max_len = model.tokenizer, model.max_seq_length
    session = _session()
    out = np.zeros((len(texts), model.get_embedding_dimension()), dtype=np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    for start in range(0, len(texts), BATCH):
        rows = order[start : start + BATCH]
        enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=max_len, return_tensors="np")
        feed = {n: enc[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")}
        hidden = session.run(None, feed)[0]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        out[rows] = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return out
