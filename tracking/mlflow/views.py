"""An execution as MLflow shows it, made from its manifest and its store: provenance tags, the dataset input, the
per-example outcomes table, question traces and the call pack (`ExecutionViews`), and the manifest made portable
(segment paths relative to the store) so that another machine can pull it (tracking/mlflow/pull.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.paths import REPO_ROOT
from core.secrets import redact_url
from engines.llm_types import bundled_model_tags, model_identity
from tracking.mlflow.log import MlflowLogger
from tracking.store.catalog import segment_exists


def store_of(record: dict[str, Any]) -> Path | None:
    """The store an execution was run on, from its manifest path (<store>/runs/<experiment>/<execution>.json)."""
    manifest = record.get("summary", {}).get("manifest")
    return Path(manifest).parents[2] if manifest else None


def store_relative(path: str | Path, store_root: Path | None) -> str:
    """A segment's path inside its store (<kind>/<experiment>/seg-*.parquet), whatever the store's location."""
    p = Path(path)
    if store_root is not None:
        try:
            return p.resolve().relative_to(store_root.resolve()).as_posix()
        except ValueError:
            pass
    return Path(*p.parts[-3:]).as_posix()


def portable_manifest(record: dict[str, Any], store_root: Path | None) -> dict[str, Any]:
    """The manifest as another machine can use it: segment paths relative to the store; no local file lists."""
    out = json.loads(json.dumps(record, default=str))
    out["segments"] = {cell: {kind: [store_relative(f, store_root) for f in files if f] for kind, files in kinds.items()}
                       for cell, kinds in record.get("segments", {}).items()}
    out["closed_book_filter_segments"] = [store_relative(f, store_root)
                                          for f in record.get("closed_book_filter_segments") or [] if f]
    out["analysis_files"] = []
    for key in ("manifest", "tracking_uri", "mlflow_parent_run_id", "mlflow_cell_run_ids", "mlflow_experiment_id"):
        out["summary"].pop(key, None)  # where it was logged and stored: set by whoever reads it back
    out["portable"] = 1
    return out


class ExecutionViews:
    """Provenance tags and MLflow-native views of one execution, read from its store (each read at most once).

    What they are made of is read best-effort: a store that lacks a segment or a call cache (a manifest synced from
    elsewhere), or a defect here, leaves that view out (logged as a warning in the run log) rather than keeping the
    execution's MLflow logging pending forever. The MLflow calls themselves raise as the rest of the logging does."""

    def __init__(self, spec: Any, record: dict[str, Any], store_root: Path | None):
        self.spec, self.record, self.store_root = spec, record, store_root
        self._provenance: dict[str, str] | None = None
        self._questions: Any = None
        self._dataset: Any = None

    def _segments(self, kind: str, cell: str | None = None) -> list[Path]:
        cells = [cell] if cell else list(self.record.get("segments", {}))
        found = {Path(f) for c in cells for f in self.record.get("segments", {}).get(c, {}).get(kind, []) if f}
        return sorted(p for p in found if segment_exists(p))

    def _prepared(self, what: str, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except Exception as exc:  # a view left out, not the execution's logging
            logging.getLogger(__name__).warning("MLflow %s of %s left out: %s: %s", what, self.spec.name,
                                                type(exc).__name__, exc)
            return None

    def questions(self):
        if self._questions is None:
            from tracking.store.ledger import Ledger

            def read():
                paths = self._segments("questions")
                return Ledger(self.store_root or ".").records("questions", paths=paths) if paths else None

            self._questions = self._prepared("questions", read)
        return self._questions

    def provenance(self) -> dict[str, str]:
        """ragledger version, schema version, code commit, spec hash, model identity, dataset and corpus hashes. No
        secrets: URLs are redacted (a URL with credentials is refused before a run starts), keys named by env var."""
        if self._provenance is None:
            import core
            from schemas.records import SCHEMA_VERSION
            spec = self.spec
            tags = {"ragledger.version": core.__version__, "ragledger.schema_version": str(SCHEMA_VERSION),
                    "ragledger.spec_hash": self.record["summary"]["spec_hash"], "ragledger.model": spec.model.display_name,
                    "ragledger.sampling": json.dumps({"temperature": spec.model.temperature, "top_p": spec.model.top_p,
                                                      "max_tokens": spec.model.max_tokens, "seed": spec.model.seed})}
            identity = self._prepared("model identity", lambda: model_identity(spec.model))
            if identity:
                tags["ragledger.model_identity"] = identity
            tags.update(bundled_model_tags(spec.model))
            q = self.questions()
            digest = self._prepared("dataset hash", lambda: questions_digest(q)) if q is not None and len(q) else None
            if digest:
                tags["ragledger.dataset_hash"] = digest
            corpus = self.record.get("corpus_hash")  # the run's plan (manifests written before it have none)
            if corpus:
                tags["ragledger.corpus_hash"] = corpus
            tags.update(self._prepared("git provenance", git_provenance) or {})
            self._provenance = tags
        return self._provenance

    def log_dataset(self, logger: Any, run_id: str, context: str = "eval") -> None:
        """The questions as the run's dataset input: the runs table's Dataset column (name, digest)."""

        if self._dataset is None:
            q, ds = self.questions(), self.spec.dataset
            if q is None or q.empty:
                return
            name = f"{ds.name}:{Path(ds.path).name if ds.path else 'default'}"
            self._dataset = self._prepared("dataset input", lambda: questions_dataset(q, name, str(ds.path or ds.name)))
        if self._dataset is not None:
            log_dataset_input(logger, run_id, self._dataset, context)

    def log_outcomes(self, logger: Any, run_id: str, cell: str) -> None:
        """The cell's per-example outcomes as an MLflow table (question, gold, prediction, EM, F1, error type)."""
        from tracking.store.ledger import Ledger

        paths, q = self._segments("outcomes", cell), self.questions()
        if not paths or q is None:
            return
        table = self._prepared(f"outcome table of {cell}", lambda: outcomes_table(
            Ledger(self.store_root or ".").records("outcomes", paths=paths), q))
        if table is not None:
            log_table(logger, run_id, table, "outcomes_table.json")

    def log_traces(self, logger: Any, parent: str, cells: dict[str, str], execution: str) -> None:
        """The lineage of a bounded sample of questions (the hardest) as MLflow traces (tracking/mlflow/traces.py).
        Best-effort as a whole, MLflow calls included: traces are a view, never a reason to keep logging pending."""
        from tracking.mlflow import traces as mlflow_traces

        def log() -> list[str]:
            n, q = mlflow_traces.sample_size(), self.questions()
            if n <= 0 or q is None or q.empty:
                return []
            return mlflow_traces.log_traces(logger, execution, self._records, q, parent, cells, n)

        self._prepared("traces", log)

    def _records(self, kind: str):
        """The execution's records of one kind (every cell), or None when the store lacks them."""
        from tracking.store.ledger import Ledger

        paths = self._segments(kind)
        return Ledger(self.store_root or ".").records(kind, paths=paths) if paths else None

    def log_callpack(self, logger: Any, run_id: str, execution: str) -> None:
        """The execution's LLM calls, from the store's call cache, as one artifact (tracking/store/callpack.py). Calls made
        by retrievers that call the model (compression, parametric) are not in it: their records carry no call id."""
        import tempfile

        from tracking.store import callpack

        cache_file = callpack.cache_path(self.store_root) if self.store_root is not None else None
        if cache_file is None or not cache_file.exists():
            return
        data = self._prepared("call pack", lambda: self._callpack(cache_file, execution))
        if data is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(callpack.ARTIFACT).name
            path.write_bytes(data)
            logger.log_artifacts(run_id, [path], str(Path(callpack.ARTIFACT).parent))

    def _callpack(self, cache_file: Path, execution: str) -> bytes | None:
        from engines.llm_cache import LLMCallCache
        from tracking.store import callpack
        from tracking.store.events import calls_of_segments

        segs = self._segments("generations") + [Path(f) for f in self.record.get("closed_book_filter_segments") or []]
        calls = calls_of_segments(segs)
        if not calls:
            return None
        cache = LLMCallCache(cache_file)
        try:
            data, _ = callpack.build(cache, calls, {"experiment": self.spec.name, "execution": execution,
                                                    "model_identity": self.provenance().get("ragledger.model_identity")})
        finally:
            cache.close()
        return data


# ---- what the views are made of ------------------------------------------------------------------------------

def git_provenance(repo: Path = REPO_ROOT) -> dict[str, str]:
    """MLflow's source tags for the code that ran, when it runs from a git checkout (nothing otherwise). The remote
    URL is redacted of credentials; `ragledger.git_dirty` says whether the checkout had uncommitted changes."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    if not (repo / ".git").exists():
        return {}
    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    tags = {"mlflow.source.git.commit": commit, "mlflow.source.type": "LOCAL", "mlflow.source.name": "ragledger"}
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    if branch and branch != "HEAD":
        tags["mlflow.source.git.branch"] = branch
    remote = git("config", "--get", "remote.origin.url")
    if remote:
        tags["mlflow.source.git.repoURL"] = redact_url(remote) or ""
    status = git("status", "--porcelain", "--untracked-files=no")
    if status is not None:
        tags["ragledger.git_dirty"] = "true" if status else "false"
    return tags


def questions_digest(questions) -> str:
    """Digest of a question sample (ids, questions, gold answers): the runs' Dataset digest in MLflow."""
    from tracking.store.events import stable_hash

    rows = sorted((str(q), str(t), [str(a) for a in a_]) for q, t, a_ in
                  zip(questions["qid"], questions["question"], questions["answers"], strict=True))
    return stable_hash("questions", rows, length=16)


def questions_dataset(questions, name: str, source: str):
    """The questions as an mlflow.data pandas dataset (question id, question, gold answers), named and digested."""
    import mlflow.data
    from mlflow.data.sources import LocalArtifactDatasetSource

    df = questions[["qid", "question", "answers"]].copy()
    df["answers"] = df["answers"].map(lambda a: [str(x) for x in a])
    return mlflow.data.from_pandas(df.reset_index(drop=True), source=LocalArtifactDatasetSource(source),
                                   name=name, digest=questions_digest(questions))


def outcomes_table(outcomes, questions):
    """One row per example: what the runs' Evaluation view shows (question, gold, prediction, EM, F1, error type)."""
    q = questions.drop_duplicates("qid").set_index("qid")
    out = outcomes.sort_values("qid")
    return {
        "qid": out["qid"].astype(str).tolist(),
        "question": [str(q["question"].get(x, "")) for x in out["qid"]],
        "gold": [" | ".join(map(str, q["answers"].get(x, []))) for x in out["qid"]],
        "prediction": out["prediction"].astype(str).tolist(),
        "em": out["em"].astype(float).tolist(),
        "f1": out["f1"].astype(float).tolist(),
        "error_type": out["error_type"].astype(str).tolist(),
    }


def log_dataset_input(logger: MlflowLogger, run_id: str, dataset, context: str = "eval") -> None:
    from mlflow.entities import DatasetInput, InputTag

    from tracking.mlflow.internals import dataset_entity

    logger.client.log_inputs(run_id, [DatasetInput(dataset_entity(dataset),
                                                   tags=[InputTag("mlflow.data.context", context)])])


def log_table(logger: MlflowLogger, run_id: str, table: dict[str, list], artifact_file: str) -> None:
    logger.client.log_table(run_id, table, artifact_file)
