"""The Python API over a store (docs/api.md): its experiments and executions, its records as pandas DataFrames (Arrow
tables on request), SQL over the views `ragledger query` reads, and the analyses the commands print.

It is a thin layer over what the commands call: the store's one read path (tracking/store/ledger.py `Ledger`) and
the analyses over it (tracking/analysis/examples.py, tables.py, history.py, lineage.py): the same reads give the same
numbers. Reading writes no record, no manifest and
nothing to MLflow (like the commands, a read may keep rebuildable projections under the store's projections/). A bad
input raises RagledgerError, whose message is the `error:` line the command prints for the same input, before
anything is read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

KINDS = ("questions", "retrievals", "generations", "votes", "outcomes")
# the order of each kind's rows in a DataFrame (after its experiment)
ORDER = {"questions": ["qid"], "retrievals": ["retriever", "qid", "rank"],
         "generations": ["cell", "qid", "round", "call_index", "sample_index"], "votes": ["cell", "qid"],
         "outcomes": ["cell", "qid"]}


class RagledgerError(Exception):
    """A bad input (an unknown experiment, cell or execution, a folder that is not a store, bad SQL): the message is
    the one line the command prints after `error:` for the same input."""


def store_root(location: str | os.PathLike[str], creating: bool = False) -> Path:
    """The store's directory from how it was named: a path, a file:// URL, or an s3:// URL (then the local mirror of
    that store, brought up to date: tracking/store/remote.py). Every store location goes through here."""
    text = os.fspath(location)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return Path(text).expanduser()
    if scheme == "file":
        return Path(rest)
    if scheme == "s3":
        from tracking.store.identity import NotAStoreError
        from tracking.store.objects import StorageError
        from tracking.store.remote import open_remote

        try:
            return open_remote(text, "--store", creating)
        except (StorageError, NotAStoreError) as exc:
            raise RagledgerError(str(exc)) from None
    raise RagledgerError(f"--store {text}: {scheme}:// stores are not supported (a local directory, file:// or s3:// URL)")


def open_store(location: str | os.PathLike[str] = ".ragledger/store") -> Store:
    """The store at `location` (default: the spec's default store, in the working directory), opened for reading."""
    from tracking.store.identity import NotAStoreError, require_store

    root = store_root(location)
    try:  # a missing folder, a file, or a folder holding no records, manifests or call cache: refused before a read
        require_store(os.fspath(location) if "://" not in os.fspath(location) else root, "--store")
    except NotAStoreError as exc:
        raise RagledgerError(str(exc)) from None
    return Store(root)


def _literal(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _arrow_or_frame(df: pd.DataFrame, arrow: bool) -> pd.DataFrame | pa.Table:
    if not arrow:
        return df
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False)


def _reraised(exc: Exception) -> RagledgerError:
    return RagledgerError(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


@dataclass(frozen=True)
class Flips:
    """Two cells compared on the questions both answered (`ragledger flips`)."""

    experiment: str
    cell_a: str
    cell_b: str
    table: pd.DataFrame  # the flip table: rows "A right"/"A wrong", columns "B right"/"B wrong"
    comparison: dict[str, Any]  # questions, won, lost, em_a, em_b, diff (ΔEM) with its 95% CI, mcnemar_p
    questions: pd.DataFrame  # the flipped questions: qid, winner, prediction_a, prediction_b


@dataclass(frozen=True)
class Analysis:
    """Seed 002's analysis of an experiment's latest execution (`ragledger analyze`, without EoR): fractions, not %."""

    experiment: str
    questions: int  # those every cell answered
    dropped_questions: int  # those some cell did not answer
    mrlr: pd.DataFrame  # per cell: reader, model, retriever, accuracy and its CI, F1, MRWR, MRLR, MRLR per error
    rwr: pd.DataFrame  # RWR(i→j) within each (reader, model) group, long: reader, model, i, j, rwr
    per_error_rwr: pd.DataFrame  # the same per error type: reader, model, error, i, j, rwr
    error_shares: pd.DataFrame  # per cell and error type: share with its 95% bootstrap CI
    identity: pd.DataFrame  # the decomposition's identity per cell, both accountings
    paired: pd.DataFrame  # every pair of cells: flip counts, ΔEM and its CI, exact McNemar p


@dataclass(frozen=True)
class Lineage:
    """One question through every cell of an experiment's latest execution (`ragledger trace`)."""

    experiment: str
    qid: str
    question: str
    answers: list[str]
    outcomes: pd.DataFrame  # one row per cell
    passages: pd.DataFrame  # per cell, by rank; has_gold: the passage holds a gold answer
    generations: pd.DataFrame  # per cell, every model call: prompt, raw output, parsed answer
    votes: pd.DataFrame  # per cell: candidates, scores, the chosen answer


class Store:
    """A store opened for reading (`open_store`)."""

    def __init__(self, root: Path):
        self.root = root

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # what the store holds

    def experiment_names(self) -> list[str]:
        """Every experiment with records in the store, by name."""
        from tracking.store.events import EventStore

        store = EventStore(self.root)
        return sorted({name for kind in KINDS for name in store.experiments(kind)})

    def _known(self, experiment: str) -> str:
        if experiment not in self.experiment_names():
            from tracking.store.ledger import Ledger

            raise _reraised(Ledger(self.root).no_outcomes(experiment))
        return experiment

    def experiments(self) -> pd.DataFrame:
        """One row per experiment: its dataset, executions, and the latest one's questions, cells, model calls and
        MLflow parent run (empty for an experiment stored without a run manifest)."""
        import pandas as pd

        rows = []
        for name in self.experiment_names():
            runs = self.executions(name)
            latest = runs.iloc[-1] if len(runs) else None
            rows.append({"experiment": name, "dataset": None if latest is None else latest["dataset"],
                         "executions": len(runs), "latest_execution": None if latest is None else latest["execution"],
                         **{k: None if latest is None else latest[k]
                            for k in ("questions", "cells", "llm_calls", "mlflow_run_id")}})
        return pd.DataFrame(rows, columns=["experiment", "dataset", "executions", "latest_execution", "questions",
                                           "cells", "llm_calls", "mlflow_run_id"])

    def executions(self, experiment: str) -> pd.DataFrame:
        """An experiment's executions (run manifests), oldest first: execution (its name), when it started (UTC),
        dataset, questions, cells, model calls, cache hits, wall time, MLflow parent run, spec hash, manifest."""
        import json

        import pandas as pd

        from tracking.store.ledger import Ledger

        rows = []
        for path in Ledger(self.root).manifests(self._known(experiment)):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise RagledgerError(f"{path}: unreadable run manifest: {exc}") from None
            s = record.get("summary", {})
            rows.append({"execution": path.stem, "started": pd.to_datetime(path.stem[:15], format="%Y%m%dT%H%M%S",
                                                                           errors="coerce", utc=True),
                         "dataset": (record.get("spec") or {}).get("dataset", {}).get("name"),
                         "questions": s.get("questions"), "cells": len(s.get("cells", {})), "llm_calls": s.get("llm_calls"),
                         "cache_hits": s.get("cache_hits"), "wall_time_s": s.get("wall_time_s"),
                         "mlflow_run_id": s.get("mlflow_parent_run_id"), "spec_hash": s.get("spec_hash"),
                         "manifest": str(path)})
        return pd.DataFrame(rows, columns=["execution", "started", "dataset", "questions", "cells", "llm_calls",
                                           "cache_hits", "wall_time_s", "mlflow_run_id", "spec_hash", "manifest"])

    def _execution(self, experiment: str, execution: str) -> dict:
        """The run manifest of an execution: "latest", or its name (or a prefix of it) as `executions` lists it."""
        from tracking.store.ledger import Ledger, LedgerError

        try:
            if execution != "latest":
                return Ledger(self.root).execution(self._known(experiment), execution)
            record = Ledger(self.root).latest_execution(self._known(experiment))
        except LedgerError as exc:
            raise _reraised(exc) from None
        if record is None:
            raise RagledgerError(f"experiment {experiment!r} has no execution (run manifest) in {self.root}")
        return record

    # records

    def questions(self, experiment: str | None = None, *, execution: str | None = None,
                  qid: str | Sequence[str] | None = None, arrow: bool = False) -> pd.DataFrame | pa.Table:
        """Question records: of one experiment (or every one), of one execution ("latest" or its name; default every
        stored record, as `ragledger query` reads them), of some questions."""
        return self._records("questions", experiment, execution, None, qid, arrow)

    def retrievals(self, experiment: str | None = None, *, execution: str | None = None, cell: str | None = None,
                   qid: str | Sequence[str] | None = None, arrow: bool = False) -> pd.DataFrame | pa.Table:
        """Retrieval records (per retriever, question and rank); `cell`: those of the cell's retriever."""
        return self._records("retrievals", experiment, execution, cell, qid, arrow)

    def generations(self, experiment: str | None = None, *, execution: str | None = None, cell: str | None = None,
                    qid: str | Sequence[str] | None = None, arrow: bool = False) -> pd.DataFrame | pa.Table:
        """Generation records: every model call, its prompt, raw output and parsed answer."""
        return self._records("generations", experiment, execution, cell, qid, arrow)

    def votes(self, experiment: str | None = None, *, execution: str | None = None, cell: str | None = None,
              qid: str | Sequence[str] | None = None, arrow: bool = False) -> pd.DataFrame | pa.Table:
        """Vote records: per cell and question, the candidates and the chosen answer."""
        return self._records("votes", experiment, execution, cell, qid, arrow)

    def outcomes(self, experiment: str | None = None, *, execution: str | None = None, cell: str | None = None,
                 qid: str | Sequence[str] | None = None, arrow: bool = False) -> pd.DataFrame | pa.Table:
        """Outcome records: per cell and question, the prediction, EM, F1, semantic match and error type."""
        return self._records("outcomes", experiment, execution, cell, qid, arrow)

    def _records(self, kind: str, experiment: str | None, execution: str | None, cell: str | None,
                 qid: str | Sequence[str] | None, arrow: bool) -> pd.DataFrame | pa.Table:
        from schemas.records import columns_of

        if experiment is not None:
            self._known(experiment)
        cell = self._cell(experiment, cell) if cell else None
        qids = None if qid is None else [qid] if isinstance(qid, str) else list(qid)
        if execution is not None:
            if experiment is None:
                raise RagledgerError("an execution is one experiment's: name its experiment too")
            df = self._execution_records(kind, experiment, execution, cell, qids)
        else:
            df = self._view_records(kind, experiment, cell, qids)
        df = df[[c for c in columns_of(kind) if c in df.columns]]
        return _arrow_or_frame(df.sort_values(["experiment", *ORDER[kind]], kind="stable").reset_index(drop=True), arrow)

    def _cell(self, experiment: str | None, words: str) -> str:
        """The cell named by `words` (its name, or words picking one: "bm25@5 post_fusion") among the outcomes'."""
        from core.cell import resolve_cell

        cells = self.query("SELECT DISTINCT cell FROM outcomes", experiment)["cell"].tolist()
        try:
            return resolve_cell(words, sorted(cells))
        except ValueError as exc:
            raise _reraised(exc) from None

    def _view_records(self, kind: str, experiment: str | None, cell: str | None, qids: list[str] | None) -> pd.DataFrame:
        """A kind's records through the query layer's views (each event once), filtered in SQL."""
        from core.cell import Cell

        where = []
        if cell is not None:
            where.append(f"retriever = {_literal(Cell.parse(cell).retriever)}" if kind == "retrievals" else
                         f"cell = {_literal(cell)}")
        if qids is not None:
            where.append(f"qid IN ({', '.join(map(_literal, qids))})" if qids else "false")
        return self.query(f"SELECT * FROM {kind}" + (f" WHERE {' AND '.join(where)}" if where else ""), experiment)

    def _execution_records(self, kind: str, experiment: str, execution: str, cell: str | None,
                           qids: list[str] | None) -> pd.DataFrame:
        """A kind's records of the segments one execution's manifest lists (each event once), then filtered. Asked by
        question (every question of the experiment when none is given), so that DuckDB reads them, as it reads the
        views: the same dtypes as `query`'s."""
        from core.cell import Cell
        from tracking.store.ledger import Ledger, LedgerError

        manifest = self._execution(experiment, execution)
        if qids is None:
            qids = self.query("SELECT DISTINCT qid FROM questions", experiment)["qid"].tolist()
        try:
            df = Ledger(self.root).records(kind, experiment, execution=manifest, qids=qids)
        except LedgerError as exc:  # a segment the manifest names is missing
            raise _reraised(exc) from None
        if cell is not None:
            df = df[df["retriever"] == Cell.parse(cell).retriever] if kind == "retrievals" else df[df["cell"] == cell]
        return df

    def query(self, sql: str, experiment: str | None = None, *, arrow: bool = False) -> pd.DataFrame | pa.Table:
        """One read-only SELECT (DuckDB) over the views questions, retrievals, generations, votes, outcomes: of one
        experiment, or of the whole store (`ragledger query`)."""
        import duckdb

        from tracking.store.ledger import Ledger

        try:
            df = Ledger(self.root).sql(sql, experiment)
        except duckdb.Error as exc:
            raise RagledgerError(f"SQL: {str(exc).splitlines()[0]}") from None
        return _arrow_or_frame(df, arrow)

    # analyses

    def readers_table(self, experiment: str, execution: str = "latest") -> pd.DataFrame:
        """The readers table `ragledger run` printed for an execution (the cells' metrics its manifest holds): one row
        per cell, EM with its 95% bootstrap CI, F1, %Unk, %NM, Recall@k, tokens and calls per question, in %. An
        experiment stored without a run manifest: the same table from its outcomes alone."""
        from tracking.analysis.history import experiment_readers_table
        from tracking.analysis.readers_table import readers_table
        from tracking.store.ledger import Ledger

        if not Ledger(self.root).manifests(self._known(experiment)):
            return self._analysed(lambda: experiment_readers_table(self.root, experiment))
        return readers_table(self._execution(experiment, execution).get("summary", {}).get("cells", {}))

    def errors(self, experiment: str, *, cell: str | None = None, error_type: str | None = None,
               include_correct: bool = False) -> pd.DataFrame:
        """The latest execution's wrong answers (`ragledger errors`): qid, cell, error type, prediction, EM, F1, gold in
        context, gold answers, question."""
        from tracking.analysis.examples import error_examples

        return self._analysed(lambda: error_examples(self.root, self._known(experiment), cell, error_type, include_correct))

    def hardest(self, experiment: str) -> pd.DataFrame:
        """The questions every cell of the latest execution gets wrong, with each cell's error type (`ragledger
        hardest`)."""
        from tracking.analysis.examples import hardest_questions

        return self._analysed(lambda: hardest_questions(self.root, self._known(experiment))[0])

    def flips(self, cell_a: str, cell_b: str, experiment: str | None = None) -> Flips:
        """Two cells of the latest execution compared (`ragledger flips`): the flip table, ΔEM with its paired-bootstrap
        CI and the exact McNemar p, the flipped questions. `experiment`: default, the one holding both cells."""
        import pandas as pd

        from tracking.analysis.examples import cell_pair
        from tracking.analysis.stats import compare_cells, flipped_questions

        def compared() -> Flips:
            name, df, a, b = cell_pair(self.root, cell_a, cell_b, self._known(experiment) if experiment else None)
            r = compare_cells(df, a, b)
            table = pd.DataFrame({"B right": [r.both_right, r.lost], "B wrong": [r.won, r.both_wrong]},
                                 index=pd.Index(["A right", "A wrong"]))
            return Flips(name, a, b, table, r.as_dict(), flipped_questions(df, a, b).reset_index(drop=True))

        return self._analysed(compared)

    def analysis(self, experiment: str, metric: str = "em") -> Analysis:
        """Seed 002's analysis of the latest execution, as `ragledger analyze` computes it (EoR aside) but writes and
        logs nothing: RWR / MRWR / MRLR per (reader, model) group, per-error RWR, error shares, the identity check,
        paired comparisons. `metric`: em, or semantic (the BEM stand-in)."""
        from tracking.analysis.inconsistency import per_error_long, rwr_long
        from tracking.analysis.tables import compute
        from tracking.store.ledger import Ledger, ensemble_rows

        def analysed() -> Analysis:
            ledger = Ledger(self.root)
            outcomes = ledger.outcomes(self._known(experiment), ledger.latest_execution(experiment))
            r = compute(outcomes[~ensemble_rows(outcomes)], experiment, metric)
            return Analysis(experiment, r.questions, r.dropped_questions, r.inconsistency, rwr_long(r.groups),
                            per_error_long(r.groups), r.shares, r.identity, r.paired)

        return self._analysed(analysed)

    def lineage(self, experiment: str, qid: str, cell: str | None = None) -> Lineage:
        """One question through the latest execution (`ragledger trace`): its passages (gold answers marked), every
        generation, the vote and the outcome, per cell (or of one cell)."""
        from ragledger.trace import stored_question

        def traced() -> Lineage:
            q = stored_question(str(self.root), self._known(experiment), qid)
            return _lineage(self.root, experiment, qid, str(q["question"]), [str(a) for a in q["answers"]], cell)

        return self._analysed(traced)

    def _analysed(self, compute_it):
        """What `compute_it` returns; the analysis layer's bad-input errors (one line each) as RagledgerError."""
        try:
            return compute_it()
        except ValueError as exc:  # AnalysisError, LedgerError, CatalogError, TraceError, a cell naming none or several
            raise _reraised(exc) from None


def _lineage(root: Path, experiment: str, qid: str, question: str, answers: list[str], cell: str | None) -> Lineage:
    import pandas as pd

    from core.cell import resolve_cell
    from tracking.analysis.lineage import cell_chain, chain_records, passage_has_gold
    from tracking.store.ledger import Ledger

    outcomes = Ledger(root).experiment_outcomes(experiment)
    outcomes = outcomes[outcomes["qid"] == qid].sort_values("cell").reset_index(drop=True)
    if cell:
        outcomes = outcomes[outcomes["cell"] == resolve_cell(cell, sorted(outcomes["cell"].unique()))]
    records = chain_records(root, experiment, [qid])
    parts: dict[str, list[pd.DataFrame]] = {"passages": [], "generations": [], "votes": []}
    for o in outcomes.itertuples():
        chain = cell_chain(o, records)
        for name, frame in (("passages", chain.passages), ("generations", chain.generations), ("votes", chain.votes)):
            parts[name].append(frame.assign(cell=o.cell))
    frames = {k: pd.concat(v, ignore_index=True) if v else records[kind].iloc[0:0]
              for (k, v), kind in zip(parts.items(), ("retrievals", "generations", "votes"), strict=True)}
    frames["passages"]["has_gold"] = [passage_has_gold(str(t), answers) for t in frames["passages"]["text"]]
    return Lineage(experiment, qid, question, answers, outcomes.reset_index(drop=True), frames["passages"],
                   frames["generations"], frames["votes"])
