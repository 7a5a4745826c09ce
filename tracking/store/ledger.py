"""The store's one read path: `Ledger(root)` answers every question a command, an analysis or a caller of ragledger as
a library asks of the stored records, as DataFrames, each event once.

- records of a kind, of an experiment, of one execution, of a cell, of some questions (`records`, `questions`);
- SQL over the views questions, retrievals, generations, votes, outcomes (`sql`, `connect`: tracking/store/query.py);
- an experiment's executions and outcomes in (cell, question) order (`manifests`, `latest_execution`, `outcomes`,
  `experiment_outcomes`);
- which experiments asked a question (`experiments_asking`, `datasets`: tracking/store/question_index.py).

The engine. DuckDB reads whatever SQL or a filter on questions narrows (the views, `records(qids=...)`, the question
index): it pushes the filter into the Parquet scan and skips a pack's row groups by their statistics, and it is the
only engine that runs `ragledger query`. Whole segments named by path (what a stage reads of its inputs, an
execution's outcomes) are read with pyarrow: opening a DuckDB connection costs more than reading a small segment,
and its frames keep the dtypes pandas wrote. Both keep of copies of an event the one that tracking/store/duck.py's
rule picks, so no read shows another copy than the views. A store at an s3:// URL is read the same way, from its
local mirror (tracking/store/remote.py fetches the objects with boto3; DuckDB needs no httpfs extension).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from core.cell import is_ensemble_retriever
from core.paths import StoreLayout
from schemas.records import columns_of, current_names
from tracking.store.catalog import SEGMENTS_COLUMN, load_catalog, reading, segment_exists, split_packed
from tracking.store.duck import earliest_select, memory_connection, sql_list
from tracking.store.events import EventStore

if TYPE_CHECKING:
    import duckdb


HISTORY_COLUMNS = ["experiment", "dataset", "cell", "prediction", "em", "f1", "error_type", "created_at"]


class LedgerError(ValueError):
    """The stored records cannot answer what was asked (one line, naming what is missing)."""


def ensemble_rows(outcomes: pd.DataFrame) -> pd.Series:
    """Which records belong to an EoR cell (core/cell.py: an `eor(...)` retriever)."""
    return outcomes["retriever"].astype(str).map(is_ensemble_retriever).astype(bool)


def _execution(manifest: Path) -> dict:
    """A run manifest's content, with its path and name."""
    try:
        return {**json.loads(manifest.read_text()), "manifest_path": str(manifest), "name": manifest.stem}
    except (OSError, ValueError) as exc:
        raise LedgerError(f"{manifest}: unreadable run manifest: {exc}") from None


class Ledger:
    """Reads of the event store at `root` (see the module doc). Holds no open file between calls."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.store = EventStore(root)

    def records(self, kind: str, experiment: str | None = None, *, execution: dict | None = None,
                cell: str | None = None, qids: Sequence[str] | None = None,
                paths: Sequence[str | Path] | None = None) -> pd.DataFrame:
        """Events of one kind, each once: of `paths` (segments, as files or compacted) when given, else of the
        `execution`'s segments (a run manifest; of `cell` only when given), else of the experiment (or the store);
        of the questions `qids` only when given."""
        if execution is not None and paths is None:
            paths = self._execution_paths(kind, execution, cell)
        if qids is not None:
            with reading(self.root):  # listed files stay until they are read (tracking/store/catalog.py)
                df = self._of_questions(kind, qids, experiment, paths)
        else:
            df = self.store.read(kind, experiment, paths)
        return df[df["cell"] == cell].reset_index(drop=True) if cell is not None and not df.empty else df

    def _of_questions(self, kind: str, qids: Sequence[str], experiment: str | None,
                      paths: Sequence[str | Path] | None) -> pd.DataFrame:
        """The records of the questions `qids`, through DuckDB: the filter reaches the Parquet scan, and in a pack
        (sorted by question) the row groups that hold them."""
        files, packed = split_packed(list(paths) if paths is not None else self.store.segments(kind, experiment))
        if not qids or (not files and not packed):
            return pd.DataFrame(columns=columns_of(kind))
        scan = "union_by_name = true, filename = true"
        parts = [f"SELECT * FROM read_parquet({sql_list([str(f) for f in files])}, {scan})"] if files else []
        parts += [f'SELECT * EXCLUDE ("{SEGMENTS_COLUMN}") FROM read_parquet({sql_list([str(pack)])}, {scan}) '
                  f'WHERE list_has_any("{SEGMENTS_COLUMN}", {sql_list(sorted(names))})' for pack, names in packed.items()]
        con = memory_connection()
        try:
            con.execute("CREATE TEMP TABLE wanted (qid VARCHAR)")
            con.executemany("INSERT INTO wanted VALUES (?)", [(str(q),) for q in dict.fromkeys(qids)])
            select = earliest_select(f"({' UNION ALL BY NAME '.join(parts)})", "qid IN (SELECT qid FROM wanted)")
            return current_names(con.execute(select).fetch_df())
        finally:
            con.close()

    def _execution_paths(self, kind: str, execution: dict, cell: str | None) -> list[str]:
        """The segments of a kind an execution's manifest names (of one cell), each checked to exist."""
        cells = execution.get("segments", {})
        paths = sorted({p for name, segs in cells.items() if cell in (None, name) for p in segs.get(kind, [])})
        missing = next((p for p in paths if not segment_exists(p)), None)
        if missing is not None:
            raise LedgerError(f"{execution.get('manifest_path')}: {kind} segment {missing} is missing from the store")
        return paths

    def questions(self, experiment: str) -> pd.DataFrame:
        """The experiment's questions by qid, each once (the latest stored)."""
        q = self.store.read("questions", experiment)
        return q.sort_values("created_at").drop_duplicates("qid", keep="last").set_index("qid")

    def sql(self, statement: str, experiment: str | None = None) -> pd.DataFrame:
        """One read-only SELECT over the views (tracking/store/query.py); ReadOnlyQueryError for anything else."""
        from tracking.store.query import query

        return query(self.root, statement, experiment)

    def connect(self, experiments: Sequence[str] | None = None,
                kinds: Sequence[str] | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with the views over the named experiments (every one for None) and kinds (all)."""
        from tracking.store.query import connect

        return connect(self.root, experiments=experiments, **({"kinds": kinds} if kinds is not None else {}))

    def manifests(self, experiment: str) -> list[Path]:
        """Run manifests of an experiment, oldest first (core/paths.py `StoreLayout.manifests`)."""
        return StoreLayout.of(self.root).manifests(experiment)

    def latest_execution(self, experiment: str) -> dict | None:
        files = self.manifests(experiment)
        return _execution(files[-1]) if files else None

    def execution(self, experiment: str, name: str | None = None, default: int = -1) -> dict:
        """The execution whose manifest's name (<UTC time>-<run token>) is or starts with `name`, else the `default`th
        (-1: the latest, -2: the one before); one of two, for a diff."""
        files = self.manifests(experiment)
        if name is None:
            if len(files) < 2:
                raise LedgerError(f"experiment {experiment!r} has {len(files)} execution(s) in {self.root}; "
                                  "a diff needs two")
            return _execution(files[default])
        hits = [p for p in files if p.stem == name or p.stem.startswith(name)]
        if len(hits) != 1:
            known = ", ".join(p.stem for p in files) or "none"
            raise LedgerError(f"{'no' if not hits else len(hits)} execution(s) of {experiment!r} match {name!r}; "
                              f"executions: {known}")
        return _execution(hits[0])

    def one_outcome_per_cell_question(self, experiments: Sequence[str]) -> set[str]:
        """Those of `experiments` whose outcomes are all in a pack that holds each (cell, question) once (its catalog
        says), so that a sum over them needs no reduction to the latest outcomes."""
        out = set()
        for name in experiments:
            entry = load_catalog(self.root, name).entry("outcomes")
            if entry is not None and entry.one_per_cell_question and len(self.store.segments("outcomes", name)) == 1:
                out.add(name)
        return out

    def cell_totals(self, experiments: Sequence[str]) -> pd.DataFrame:
        """Per (experiment, cell): questions, right (EM), mean EM and F1, each question counted once: its latest
        outcome (an experiment run again with another prompt holds the outcomes of both executions). An experiment
        whose catalog says it holds one outcome per cell and question is summed as it is; the others are reduced to
        their latest outcomes first, which is the costly part of a query over many uncompacted experiments."""
        unique = self.one_outcome_per_cell_question(experiments)
        with reading(self.root), contextlib.closing(self.connect(experiments, ("outcomes",))) as con:
            con.execute("CREATE TEMP TABLE reduced (experiment VARCHAR)")
            reduced = [(n,) for n in experiments if n not in unique]
            if reduced:
                con.executemany("INSERT INTO reduced VALUES (?)", reduced)
            return con.execute(
                "WITH o AS (SELECT experiment, cell, em, f1 FROM outcomes WHERE experiment NOT IN (SELECT * FROM reduced) "
                "UNION ALL SELECT experiment, cell, em, f1 FROM outcomes WHERE experiment IN (SELECT * FROM reduced) "
                "QUALIFY row_number() OVER (PARTITION BY experiment, cell, qid ORDER BY created_at DESC, event_id) = 1) "
                "SELECT o.experiment, o.cell, count(*) AS questions, "
                "sum(CASE WHEN o.em >= 1 THEN 1 ELSE 0 END) AS right, avg(o.em) AS em, avg(o.f1) AS f1 "
                "FROM o GROUP BY ALL").fetch_df()

    def no_outcomes(self, experiment: str) -> LedgerError:
        """The error for an experiment this store holds no outcome of (a mistyped name, usually)."""
        return LedgerError(f"experiment {experiment!r}: no outcome records under {self.root / 'outcomes' / experiment}")

    def outcomes(self, experiment: str, execution: dict | None = None) -> pd.DataFrame:
        """Outcomes of the execution's segments (when its manifest names some), else every outcome of the experiment,
        in (cell, question) order. Restricting to one execution keeps an earlier run with another question sample or
        prompt version from being mixed into an analysis."""
        paths = self._execution_paths("outcomes", execution, None) if execution is not None else []
        df = self.records("outcomes", paths=paths) if paths else self.records("outcomes", experiment)
        if df.empty and not paths:
            raise self.no_outcomes(experiment)
        # the files' own order differs between a pack and the segments it replaced
        return df.sort_values(["cell", "qid"], kind="stable").reset_index(drop=True)

    def experiment_outcomes(self, experiment: str) -> pd.DataFrame:
        """The latest execution's outcomes plus the experiment's stored EoR cells (each (cell, qid) once)."""
        df = self.outcomes(experiment, self.latest_execution(experiment))
        every = self.records("outcomes", experiment)
        eor = every[ensemble_rows(every)] if not every.empty else every
        df = pd.concat([df[~ensemble_rows(df)], eor], ignore_index=True)
        # a total order: the rows' order in the files differs between a pack and the segments it replaced
        df = df.sort_values(["created_at", "cell", "qid"], kind="stable")
        return df.drop_duplicates(["cell", "qid"], keep="last").reset_index(drop=True)

    def experiments(self, patterns: Sequence[str] | None = None, kind: str = "outcomes") -> list[str]:
        """The store's experiments holding records of `kind`, by name: all, or those matching any of the shell
        `patterns` (`nq-*`)."""
        names = self.store.experiments(kind)
        return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)] if patterns else names

    def question_history(self, qid: str, experiments: Sequence[str] | None = None) -> pd.DataFrame:
        """Every stored outcome of question `qid`, oldest first: experiment, dataset, cell, prediction, em, f1, error
        type, when. Only the experiments that asked it are opened (the question index), and in each pack only the
        row group holding it (packs are sorted by question)."""
        asked = self.experiments_asking(qid)
        names = [n for n in (experiments if experiments is not None else self.experiments()) if n in asked]
        if not names:
            return pd.DataFrame(columns=HISTORY_COLUMNS)
        with reading(self.root), contextlib.closing(self.connect(names, ("outcomes",))) as con:
            df = con.execute(f"SELECT {', '.join(c for c in HISTORY_COLUMNS if c != 'dataset')} FROM outcomes "
                             "WHERE qid = ? ORDER BY created_at, experiment, cell", [qid]).fetch_df()
        df.insert(1, "dataset", df["experiment"].map(asked))
        return df

    def question(self, qid: str, experiments: Sequence[str]) -> tuple[str, list[str]] | None:
        """Question `qid`'s text and gold answers, from the first of `experiments` that stored it."""
        with reading(self.root), contextlib.closing(self.connect(experiments[:1], ("questions",))) as con:
            row = con.execute("SELECT question, answers FROM questions WHERE qid = ? LIMIT 1", [qid]).fetchone()
        return (row[0], list(row[1])) if row else None

    def experiments_asking(self, qid: str) -> dict[str, str]:
        """Experiment -> dataset, for every experiment that stored question `qid` (tracking/store/question_index.py)."""
        from tracking.store.question_index import experiments_asking

        return experiments_asking(self.root, qid)

    def datasets(self) -> dict[str, str]:
        """Experiment -> its questions' dataset."""
        from tracking.store.question_index import datasets

        return datasets(self.root)

