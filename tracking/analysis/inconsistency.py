"""Seed 002's analyses over stored outcomes: retriever inconsistency (RWR / MRWR / MRLR), the error
decomposition with its identity check, per-error RWR, and error shares with bootstrap CIs.

Pure functions over DataFrames / numpy arrays; they never call a model. Definitions follow seed 002
(/work/shared/seeds/002_75b30ca132fc2176.txt, the MRWR / MRLR paragraph): RWR compares retrievers
with the reader and the LM held fixed, so every inconsistency table is computed per (reader, model)
group (`inconsistency_by_group`); pooling cells of several readers or models would count reader or
model differences as retriever inconsistency. Conventions for empty sets (no NaN reaches MLflow):
- RWR(i→j) = 0 when cell i never fails (|{n: c_i[n]=0}| = 0): nothing of i's failure can be fixed.
- The diagonal RWR(i→i) is 0 and is excluded from MRWR / MRLR.
- `rwr` of a single cell (no j ≠ i) gives MRLR / MRWR 0; a (reader, model) group of one retriever
  has no inconsistency table at all (`RetrieverGroup.rwr` is None, its MRLR / MRWR NaN).
- RWR_e(i→j) = 0 when cell i never makes error e.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core.cell import Cell
from tracking.analysis.metrics import bootstrap_ci
from tracking.store.ledger import LedgerError

CORRECTNESS = ("em", "semantic")
ERROR_INDICATORS = ("RE", "LG", "RF", "EE", "HE", "abstain", "HE_literal")
# classes of the "own class" accounting (abstentions separate); shares sum to 1 per cell
SHARE_CLASSES = ("correct", "lucky_guess", "retrieval_failure", "extraction_error", "hallucination_error", "abstention")


class AnalysisError(LedgerError):
    """Stored outcomes cannot be analysed as asked (one line, naming what is missing); a LedgerError, so a command
    reports a failed read and a failed analysis alike."""


def rwr(correct: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RWR matrix, MRWR and MRLR from a boolean cells × questions correctness array.

    RWR[i, j] = |{n: c[i,n]=0, c[j,n]=1}| / |{n: c[i,n]=0}| (0 when i never fails; diagonal 0).
    MRWR[j] = mean over i≠j of RWR[i, j] (column mean); MRLR[i] = mean over j≠i of RWR[i, j] (row mean).
    """
    c = _cells_by_questions(correct, "rwr")
    return _win_matrix(~c, c)


def rwr_error(indicator: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-error RWR: RWR_e[i, j] = |{n: e[i,n]=1, e[j,n]=0}| / |{n: e[i,n]=1}| (0 when i never makes e)."""
    e = _cells_by_questions(indicator, "rwr_error")
    return _win_matrix(e, ~e)


def _cells_by_questions(values: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(values)
    if a.ndim != 2:
        raise AnalysisError(f"{name}: expected a 2-D cells × questions array, got shape {a.shape}")
    return a.astype(bool)


def _win_matrix(lose: np.ndarray, win: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # |lose_i ∧ win_j| for every pair by popcount over bit-packed rows: exact, single-threaded and
    # ~10× faster than a float matrix product (whose BLAS threads stall on a loaded machine)
    lp, wp = np.packbits(lose, axis=1), np.packbits(win, axis=1)
    counts = np.zeros((lose.shape[0], win.shape[0]), dtype=np.int64)
    for i in range(lose.shape[0]):
        counts[i] = np.bitwise_count(lp[i] & wp).sum(axis=1, dtype=np.int64)
    denom = lose.sum(axis=1).astype(np.float64)
    matrix = np.divide(counts, denom[:, None], out=np.zeros(counts.shape, dtype=np.float64), where=denom[:, None] > 0)
    np.fill_diagonal(matrix, 0.0)
    k = matrix.shape[0]
    if k < 2:
        return matrix, np.zeros(k), np.zeros(k)
    mrwr = matrix.sum(axis=0) / (k - 1)
    mrlr = matrix.sum(axis=1) / (k - 1)
    return matrix, mrwr, mrlr


def correctness_matrix(outcomes: pd.DataFrame, metric: str = "em") -> tuple[np.ndarray, list[str], list[str]]:
    """Boolean cells × questions array over the questions every cell answered; returns (array, cells, qids).

    metric "em": EM = 1; "semantic": the stored semantic match (EM when it was not computed).
    Cells and questions are sorted by name.
    """
    right = correct_answers(outcomes, metric)
    if outcomes.empty:
        raise AnalysisError("no outcome records to analyse")
    return cell_question_matrix(outcomes, right)


def cell_question_matrix(outcomes: pd.DataFrame, values: np.ndarray) -> tuple[np.ndarray, list[str], list[str]]:
    """Scatter per-row booleans into a cells × questions array (numpy, not pivot_table: this runs on
    millions of rows), on the questions every cell answered; a question answered twice by a cell counts as right if
    either record is."""
    ccode, cuniq = pd.factorize(outcomes["cell"].astype(str), sort=True)
    qcode, quniq = pd.factorize(outcomes["qid"].astype(str), sort=True)
    present = np.zeros((len(cuniq), len(quniq)), dtype=bool)
    present[ccode, qcode] = True
    arr = np.zeros_like(present)
    if len(ccode) == int(present.sum()):  # each (cell, question) once: plain assignment
        arr[ccode, qcode] = values
    else:
        np.logical_or.at(arr, (ccode, qcode), values)
    cell_names, q_names = [str(c) for c in cuniq], [str(q) for q in quniq]
    keep = present.all(axis=0)
    return arr[:, keep], cell_names, [q for q, k in zip(q_names, keep, strict=True) if k]


def correct_answers(outcomes: pd.DataFrame, metric: str) -> np.ndarray:
    """Per outcome row: right under `metric` (em; semantic: the stored semantic match, EM where it was not computed)."""
    if metric not in CORRECTNESS:
        raise AnalysisError(f"correctness metric must be one of {CORRECTNESS}, got {metric!r}")
    em = outcomes["em"].to_numpy(dtype=float) >= 1.0
    if metric == "em":
        return em
    sem = pd.to_numeric(outcomes["semantic_match"], errors="coerce").to_numpy(dtype=float)
    return np.where(np.isnan(sem), em, sem >= 0.5)


def decompose(outcomes_df: pd.DataFrame) -> pd.DataFrame:
    """Per (question, cell) error decomposition of seed 002, with indicator columns.

    Adds: correct, fail, RE (gold not in context), LG (correct with RE), RF (retrieval failure: wrong,
    RE, not an abstention), EE (extraction error), HE (hallucination error, abstentions excluded),
    abstain (an "unknown" answer that is wrong), HE_literal (HE plus abstentions without RE: the
    paper's literal definition, under which an abstention with RE is a retrieval failure), and
    `error_type` (the own-class accounting, one of SHARE_CLASSES). Correct = EM.
    """
    need = {"cell", "qid", "em", "is_unknown", "gold_in_context", "error_type"}
    missing = need - set(outcomes_df.columns)
    if missing:
        raise AnalysisError(f"outcomes: missing column(s) {sorted(missing)}")
    df = outcomes_df.copy(deep=False)  # new columns only; the caller's frame is left as it is
    correct = df["em"].to_numpy(dtype=float) >= 1.0
    unknown = df["is_unknown"].to_numpy(dtype=bool)
    gic = df["gold_in_context"].to_numpy(dtype=bool)
    stored_ee = df["error_type"].eq("extraction_error").to_numpy(dtype=bool)
    re_ = ~gic
    wrong = ~correct
    abstain = wrong & unknown
    # prediction-in-context is not a column of its own; evaluate.py recorded it as EE vs HE
    ee = wrong & ~unknown & gic & stored_ee
    he = wrong & ~unknown & gic & ~ee
    df["correct"] = correct
    df["fail"] = wrong
    df["RE"] = re_
    df["LG"] = correct & re_
    df["RF"] = wrong & re_ & ~unknown
    df["EE"] = ee
    df["HE"] = he
    df["abstain"] = abstain
    df["HE_literal"] = he | (abstain & gic)
    # codes into SHARE_CLASSES; a categorical keeps 1.6 M labels cheap
    codes = np.select([correct & gic, correct & re_, df["RF"].to_numpy(), ee, he], [0, 1, 2, 3, 4], default=5).astype(np.int8)
    df["error_type"] = pd.Categorical.from_codes(codes, categories=list(SHARE_CLASSES))
    return df


@dataclass(frozen=True)
class IdentityCheck:
    cell: str
    p_fail: float
    p_re: float
    p_lg: float
    p_ee: float
    p_he_literal: float
    p_he: float
    p_abstain_no_re: float
    residual_literal: float  # P(fail) - [P(RE) - P(LG) + P(EE) + P(HE_literal)]
    residual_own_class: float  # P(fail) - [P(RE) - P(LG) + P(EE) + P(HE) + P(abstain ∧ ¬RE)]

    @property
    def holds(self) -> bool:
        return abs(self.residual_literal) < 1e-9 and abs(self.residual_own_class) < 1e-9


def identity_checks(decomposed: pd.DataFrame) -> list[IdentityCheck]:
    """Check P(fail) = P(RE) − P(LG) + P(EE) + P(HE) per cell, under both accountings of abstentions."""
    out = []
    cols = ["fail", "RE", "LG", "EE", "HE_literal", "HE"]
    means = decomposed.groupby("cell", sort=True)[cols].mean()
    abst = (decomposed["abstain"] & ~decomposed["RE"]).groupby(decomposed["cell"], sort=True).mean()
    for cell, m in means.iterrows():
        a = float(abst.loc[cell])
        lit = m["fail"] - (m["RE"] - m["LG"] + m["EE"] + m["HE_literal"])
        own = m["fail"] - (m["RE"] - m["LG"] + m["EE"] + m["HE"] + a)
        out.append(IdentityCheck(str(cell), float(m["fail"]), float(m["RE"]), float(m["LG"]), float(m["EE"]),
                                 float(m["HE_literal"]), float(m["HE"]), a, float(lit), float(own)))
    return out


def identity_table(decomposed: pd.DataFrame) -> pd.DataFrame:
    """identity.parquet: one row per cell, the shares of identity_checks, `holds`, and `retriever_error_pct`, seed
    002's retrieval error of the cell's retriever (100 * P(RE): the share of questions whose context lacks every gold
    answer; for a reader that reads its retrieval as is, 100 - Recall@k)."""
    return pd.DataFrame([vars(c) | {"holds": c.holds, "retriever_error_pct": 100 * c.p_re}
                         for c in identity_checks(decomposed)])


def error_shares(decomposed: pd.DataFrame, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Share of each error class per cell with percentile bootstrap CIs over questions.

    Resampling n questions with replacement and counting classes is exactly a draw from
    Multinomial(n, observed shares), so the bootstrap is drawn that way (identical distribution,
    O(resamples × classes) instead of O(resamples × n)). Seeded per cell by its position.
    Long format: cell, error_type, count, n, share, lo, hi.
    """
    rows = []
    for k, (cell, et) in enumerate(decomposed["error_type"].groupby(decomposed["cell"], sort=True)):
        n = len(et)
        counts = et.astype(str).value_counts().reindex(SHARE_CLASSES, fill_value=0).to_numpy()
        p = counts / n
        rng = np.random.default_rng([seed, k])
        draws = rng.multinomial(n, p, size=n_resamples) / n
        lo = np.quantile(draws, alpha / 2, axis=0)
        hi = np.quantile(draws, 1 - alpha / 2, axis=0)
        for i, cls in enumerate(SHARE_CLASSES):
            rows.append({"cell": str(cell), "error_type": cls, "count": int(counts[i]), "n": n,
                         "share": float(p[i]), "lo": float(lo[i]), "hi": float(hi[i])})
    return pd.DataFrame(rows)


def accuracy_ci(values: np.ndarray, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """Mean of 0/1 (or [0,1]) values with its percentile bootstrap CI (tracking.analysis.metrics.bootstrap_ci: with EM as the
    metric, the same CI as the readers table's)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return (0.0, 0.0, 0.0)
    lo, hi = bootstrap_ci(v, n_resamples=n_resamples, seed=seed, alpha=alpha)
    return float(v.mean()), lo, hi


def indicator_matrices(decomposed: pd.DataFrame, cells: list[str], columns: list[str]) -> dict[str, np.ndarray]:
    """cells × questions boolean arrays of several indicator columns at once (one factorization;
    questions sorted by id). Assumes every cell answered every question in `decomposed`."""
    ccode, cuniq = pd.factorize(decomposed["cell"].astype(str), sort=True)
    qcode, quniq = pd.factorize(decomposed["qid"].astype(str), sort=True)
    pos = {str(c): i for i, c in enumerate(cuniq)}
    rows = [pos[c] for c in cells]
    out = {}
    for col in columns:
        arr = np.zeros((len(cuniq), len(quniq)), dtype=bool)
        np.logical_or.at(arr, (ccode, qcode), decomposed[col].to_numpy(dtype=bool))
        out[col] = arr[rows]
    return out


def sort_by_accuracy(correct: np.ndarray, cells: list[str]) -> list[int]:
    """Cell order for tables and heatmaps: accuracy descending, ties by name (seed 002's figures)."""
    acc = correct.mean(axis=1) if correct.size else np.zeros(len(cells))
    return sorted(range(len(cells)), key=lambda i: (-acc[i], cells[i]))


def inconsistency_table(correct: np.ndarray, cells: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-cell table: cell, accuracy, MRWR, MRLR, failures; RWR matrix as a DataFrame), sorted by accuracy."""
    order = sort_by_accuracy(correct, cells)
    c = correct[order]
    names = [cells[i] for i in order]
    matrix, mrwr, mrlr = rwr(c)
    table = pd.DataFrame({"cell": names, "accuracy": c.mean(axis=1) if c.size else 0.0, "MRWR": mrwr, "MRLR": mrlr,
                          "failures": (~c).sum(axis=1), "questions": c.shape[1]})
    return table, pd.DataFrame(matrix, index=names, columns=names)


INCONSISTENCY_COLUMNS = ("MRWR", "MRLR")


def cell_keys(outcomes: pd.DataFrame) -> pd.DataFrame:
    """retriever, reader and model of every cell, indexed by cell name.

    From the records' `retriever` / `reader` / `model` columns; without them, from the cell name
    "retriever · reader · model" (tasks build it so); a name of another shape is its own retriever
    in one unnamed group, so ad-hoc frames keep working."""
    cols = ["retriever", "reader", "model"]
    if set(cols) <= set(outcomes.columns):
        return outcomes[["cell", *cols]].drop_duplicates("cell").astype(str).set_index("cell")
    rows = {}
    for c in outcomes["cell"].astype(str).unique():
        try:
            cell = Cell.parse(c)
            rows[c] = [cell.retriever, cell.reader, cell.model]
        except ValueError:
            rows[c] = [c, "", ""]
    return pd.DataFrame.from_dict(rows, orient="index", columns=["retriever", "reader", "model"]).rename_axis("cell")


def group_label(reader: str, model: str) -> str:
    """How tables, plots and the CLI name a (reader, model) group."""
    return f"reader {reader or '-'} · model {model or '-'}"


@dataclass
class RetrieverGroup:
    """The retriever-cells of one (reader, model) group and their inconsistency tables."""

    reader: str
    model: str
    cells: list[str]  # by accuracy, best first (ties by name)
    retrievers: list[str]  # the cells' retrievers, same order
    table: pd.DataFrame  # inconsistency_table of the group: cell, accuracy, MRWR, MRLR, failures, questions
    rwr: pd.DataFrame | None  # RWR(i→j) among the group's cells; None for one retriever (nothing to compare)
    per_error_rwr: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return group_label(self.reader, self.model)

    @property
    def comparable(self) -> bool:
        return len(self.cells) >= 2


def inconsistency_by_group(correct: np.ndarray, cells: list[str], keys: pd.DataFrame) -> list[RetrieverGroup]:
    """One inconsistency table per (reader, model) group (seed 002 varies only the retriever).

    `correct` is cells × questions in `cells` order, `keys` comes from `cell_keys`. Groups are sorted by
    (reader, model); a group of one retriever keeps its accuracy but gets NaN MRWR / MRLR and no RWR."""
    pos = {c: i for i, c in enumerate(cells)}
    out = []
    sub = keys.loc[cells]
    for (reader, model), g in sub.groupby(["reader", "model"], sort=True):
        members = list(g.index)
        table, matrix = inconsistency_table(correct[[pos[c] for c in members]], members)
        names = list(table["cell"])
        if len(names) < 2:
            table[list(INCONSISTENCY_COLUMNS)] = np.nan
        out.append(RetrieverGroup(str(reader), str(model), names, [str(keys.at[c, "retriever"]) for c in names], table,
                                  matrix if len(names) >= 2 else None))
    return out


PER_ERRORS = ("RE", "LG", "EE", "HE", "abstain")
RWR_COLUMNS = ["reader", "model", "i", "j", "rwr"]
PER_ERROR_COLUMNS = ["reader", "model", "error", "i", "j", "rwr"]


def _long(matrix: pd.DataFrame, **extra: str) -> pd.DataFrame:
    out = matrix.stack().rename("rwr").rename_axis(["i", "j"]).reset_index()
    for k, v in reversed(extra.items()):
        out.insert(0, k, v)
    return out


def rwr_long(groups: list[RetrieverGroup]) -> pd.DataFrame:
    """Every group's RWR matrix in long format (reader, model, i, j, rwr); only pairs within a group."""
    parts = [_long(g.rwr, reader=g.reader, model=g.model) for g in groups if g.rwr is not None]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=RWR_COLUMNS)


def per_error_long(groups: list[RetrieverGroup]) -> pd.DataFrame:
    """Every group's per-error RWR matrices in long format (reader, model, error, i, j, rwr)."""
    parts = [_long(m, reader=g.reader, model=g.model, error=e) for g in groups for e, m in g.per_error_rwr.items()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=PER_ERROR_COLUMNS)


@dataclass(frozen=True)
class Section:
    """What an analysis shows, alike in the report and on the terminal: a heading, sentences, a table of display
    strings."""

    title: str
    lines: tuple[str, ...] = ()
    table: pd.DataFrame | None = None
    kind: str = "analysis"  # the report's class for the table
    row_titles: tuple[str, ...] = ()  # the report's tooltip per row (a cell's whole name)
    images: dict[str, bytes] = field(default_factory=dict)  # figures shown under it in the report
    report_only: bool = False  # too long for the terminal

    def as_dict(self) -> dict[str, Any]:
        """For the command line, through the analysis flow's result."""
        t = self.table if self.table is not None else pd.DataFrame()
        return {"title": self.title, "lines": list(self.lines), "columns": [str(c) for c in t.columns],
                "rows": t.astype(str).values.tolist(), "report_only": self.report_only}


@dataclass
class Outputs:
    """What one analysis of the registry (tracking/analysis/registry.py) adds: files (`name.parquet` tables, PNG
    figures, JSON), sections and MLflow metrics."""

    files: dict[str, pd.DataFrame | bytes | str] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AnalysisResult:
    """Every table of an experiment's analysis (tracking/analysis/tables.py `compute`), as the report and the CLI show it."""

    experiment: str
    questions: int
    cells: list[str]  # grouped by (reader, model), by accuracy within a group
    inconsistency: pd.DataFrame  # one row per cell, with its group's reader and model
    groups: list[RetrieverGroup]  # the per-(reader, model) RWR tables
    decomposition: pd.DataFrame
    shares: pd.DataFrame
    identity: pd.DataFrame
    paired: pd.DataFrame
    eor: dict[str, Any] = field(default_factory=dict)
    eor_results: dict[str, AnalysisResult] = field(default_factory=dict)
    pngs: dict[str, bytes] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    parent_run_id: str | None = None
    tracking_uri: str | None = None
    dropped_questions: int = 0
    metric: str = "em"
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # the registered analyses' (tracking/analysis/registry.py)
    outputs: dict[str, Outputs] = field(default_factory=dict)  # every analysis of the registry's, by name
