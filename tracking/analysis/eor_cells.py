"""Ensemble-of-Retrievers cells over an experiment's stored outcomes: one EoR per (reader, model), fitted
(tracking/analysis/eor.py, which holds the definitions) on its retriever-cells' training questions, its held-out
answers written as OutcomeRecords of the cell `eor(r1,...,rn,pooling=<pooling>)` · reader · model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.cell import Cell
from tracking.analysis.eor import (
    DEFAULT_POOLING,
    DROP_BELOW,
    EOR_VERSION,
    METRICS,
    TRAIN_SHARE,
    EoRFit,
    check_pooling,
    choose,
    fit,
    is_train,
    similarity_tensor,
)
from tracking.store.events import EventStore, event_id, new_events, stable_hash
from tracking.store.ledger import ensemble_rows


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
