"""The experiment spec: one YAML file, validated by pydantic, rejecting unknown fields by name."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engines.llm_types import endpoint_url_problem
from engines.models import DEFAULT_MODEL
from schemas.messages import field_errors, pydantic_message
from schemas.reader_entry import ReaderEntry


class SpecError(ValueError):
    """The spec file is malformed or has an invalid field; the message names file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSpec(_Strict):
    name: str = Field("squad", description="the file format: a format registered in core/datasets.py "
                      "DATASET_FORMATS (the table of dataset formats below)")
    path: str = Field("squad/dev-v1.1.json.gz", description="file, relative to the data dir unless absolute")
    limit: int | None = Field(None, gt=0, description="number of questions sampled (seeded); all if unset")
    seed: int = Field(0, description="sampling seed of the `limit` questions")
    closed_book_filter: bool = Field(False, description="seed 001 §4: drop the sampled questions the model answers "
                                     "correctly (EM) with no context, before retrieval")

    @field_validator("name", mode="before")
    @classmethod
    def _known_format(cls, name: object) -> object:
        from core.datasets import DATASET_FORMATS

        return _one_of(name, DATASET_FORMATS)

    def identity(self) -> dict:
        """What selects the sampled questions (the filter acts after sampling, so it is not part of it)."""
        return self.model_dump(exclude={"closed_book_filter"})

    def sampled_questions(self) -> list:
        """The questions a run uses: the dataset loaded, then its seeded sample of `limit` (core/datasets.py)."""
        from core.datasets import load_sample

        return load_sample(self.name, self.path, self.limit, self.seed)


LABEL_PATTERN = r"^[A-Za-z0-9_.\-]+$"


def _one_of(value: object, registered: Iterable[str]) -> object:
    """A registered name (core/datasets.py, strategies/retrievers/corpus.py), or the message of an enumeration."""
    names = [repr(n) for n in registered]
    if value not in registered:
        raise ValueError(f"{value!r} is not one of {', '.join(names[:-1])} or {names[-1]}")
    return value


def _list_entry(model: type[BaseModel], value: dict, where: str) -> BaseModel:
    """One entry of a list field, validated with one message that names it (`dataset[1].path: ...`)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{where}.{'.'.join(str(p) for p in err['loc'])}: {pydantic_message(err)}") from None


class DatasetEntry(DatasetSpec):
    """One dataset of a sweep (a spec whose `dataset` is a list): it becomes the experiment `<spec name>.<label>`."""

    label: str | None = Field(None, pattern=LABEL_PATTERN, description="default: the dataset name")

    @property
    def key(self) -> str:
        return self.label or self.name

    def dataset(self) -> DatasetSpec:
        """The plain dataset: the label names the experiment only, so it enters no hash or question id."""
        return DatasetSpec.model_validate(self.model_dump(exclude={"label"}))


class CorpusSpec(_Strict):
    name: str = Field("squad-paragraphs", description="a passage file format registered in core/datasets.py "
                      "CORPUS_FORMATS, `lucene` (an existing Lucene index with stored documents) or `prebuilt` (a "
                      "Pyserini prebuilt index by name); the table of corpus kinds below")
    paths: list[str] = Field(default_factory=lambda: ["squad/dev-v1.1.json.gz", "squad/train-v1.0.json.gz"], min_length=1,
                             description="SQuAD JSON files, the one JSONL / TSV file, the Lucene index folder, or the "
                             "prebuilt index's name (e.g. wikipedia-dpr-100w); files relative to the data dir unless absolute")
    @field_validator("name", mode="before")
    @classmethod
    def _known_kind(cls, name: object) -> object:
        from strategies.retrievers.corpus import corpus_kinds

        return _one_of(name, corpus_kinds())

    faiss: str | None = Field(None, description="a FAISS index directory in Pyserini's layout ('index', 'docid') over "
                              "these passages, which dense@k searches instead of building its own; its vectors must be "
                              "the bundled encoder's (all-MiniLM-L6-v2, the query encoder here)")


class ModelSpec(_Strict):
    name: str = Field("embedded", description="'embedded' or the model name the endpoint serves")
    backend: Literal["embedded", "openai"] = Field("embedded", description="the bundled llama.cpp model started by "
                                                   "the run, or an OpenAI-compatible endpoint (vLLM, OpenAI)")
    embedded_model: str = Field(DEFAULT_MODEL, description="bundled GGUF when backend=embedded")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint (vLLM, OpenAI, ...)")
    api_key_env: str | None = Field(None, description="name of the env var holding the API key (never the key)")
    temperature: float = Field(0.0, ge=0, le=2, description="sampling temperature of every call (0: greedy); "
                               "self-consistency samples use the reader's sample_temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling")
    max_tokens: int = Field(32, gt=0, le=4096, description="output tokens of a short-answer call; strategies that "
                            "write rationales or summaries set their own per call")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="request seed (sample i sends seed + i); vLLM takes 64-bit values only")
    concurrency: int = Field(4, gt=0, le=1024, description="model requests in flight at once; match the server's "
                             "batch size (vLLM --max-num-seqs)")
    timeout_s: float = Field(120.0, gt=0, description="seconds before one request is abandoned and retried")
    max_retries: int = Field(6, ge=0, le=50, description="retries of a failed request (HTTP 429/5xx, timeouts), "
                             "with exponential backoff and Retry-After")
    context_window: int = Field(4096, ge=512, description="the embedded server's context in tokens "
                                "(a longer prompt ends the run naming cell and question); a remote server has its own")

    @field_validator("base_url")
    @classmethod
    def _no_credentials_in_url(cls, url: str | None) -> str | None:
        from core.secrets import refuse_credentials

        refuse_credentials(url, None, "put the API key in an environment variable and name it in model.api_key_env")
        return url

    @model_validator(mode="after")
    def _endpoint(self) -> ModelSpec:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("model.base_url is required when model.backend is 'openai'")
        if self.backend == "openai" and (problem := endpoint_url_problem(self.base_url)):  # the embedded calls none
            raise ValueError(f"model.base_url: {problem}")
        return self

    @property
    def display_name(self) -> str:
        return self.embedded_model if self.backend == "embedded" else self.name


# A run's default shards: at least SHARD_MIN questions each, at most SHARDS_AT_MOST of them. Each task run costs
# Prefect ~0.1 s of this 2-core machine's CPU: at 25 questions a shard, 2,000 questions made 320 tasks and
# half a minute of them (docs/performance.md, "The fixed cost of a small run")
SHARD_MIN, SHARDS_AT_MOST = 25, 16


class ExecutionSpec(_Strict):
    shard_size: int | None = Field(None, gt=0, description="questions per Prefect task run (default: 25, or more so "
                                   "that a run has at most 16 shards)")
    runner: Literal["thread", "dask"] = Field("thread", description="Prefect task runner: threads in this process, or Dask")
    workers: int = Field(2, gt=0, description="Dask: worker processes of the local cluster")
    scheduler_address: str | None = Field(None, description="Dask: an existing scheduler (tcp://host:8786), not a local "
                                          "cluster; implies runner: dask")

    def runner_taken(self, override: str | None = None) -> str:
        """The task runner a run takes: the one given for this run (--runner), else the spec's."""
        return override or self.runner

    def shard_size_for(self, questions: int) -> int:
        """Questions per shard of a run over `questions` sampled questions: the given size, else the default."""
        if self.shard_size is not None:
            return self.shard_size
        return max(SHARD_MIN, -(-questions // SHARDS_AT_MOST))

    @model_validator(mode="before")
    @classmethod
    def _scheduler_means_dask(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("scheduler_address"):
            if data.get("runner", "dask") != "dask":
                raise ValueError("scheduler_address is a Dask scheduler: set runner: dask (or leave runner out)")
            return {**data, "runner": "dask"}
        return data


class TrackingSpec(_Strict):
    store: str = Field(".ragledger/store", description="event store directory")
    mlflow_uri: str | None = Field(None, description="tracking URI; default: SQLite under .ragledger/")
    mlflow_experiment: str | None = Field(None, description="MLflow experiment name; default: spec name")
    compact: bool = Field(True, description="at the end of each run, compact the experiment's record segments into "
                          "one pack per kind (tracking/store/compaction.py); the events and every query's answer stay "
                          "the same")

    @field_validator("mlflow_uri")
    @classmethod
    def _no_credentials_in_uri(cls, uri: str | None) -> str | None:
        from core.secrets import refuse_credentials

        refuse_credentials(uri, None, "MLflow reads them from MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD "
                           "(an MLflow server) or PGPASSWORD (PostgreSQL)")
        return uri


class _SpecBase(_Strict):
    """What an experiment spec and a sweep spec share; they differ in `dataset` (one mapping, or a list)."""

    name: str = Field(..., min_length=1, pattern=LABEL_PATTERN)
    description: str = ""
    dataset: DatasetSpec | list[DatasetEntry]  # narrowed by each subclass; declared here to keep the field order
    corpus: CorpusSpec = CorpusSpec()
    retrievers: list[str] = Field(..., min_length=1)
    readers: list[str | ReaderEntry] = Field(..., min_length=1)
    model: ModelSpec = ModelSpec()
    execution: ExecutionSpec = ExecutionSpec()
    tracking: TrackingSpec = TrackingSpec()

    @field_validator("retrievers")
    @classmethod
    def _known_retrievers(cls, names: list[str]) -> list[str]:
        from strategies.retrievers import parse_retriever

        for name in names:
            parse_retriever(name)  # raises ValueError naming the problem
        if len(set(names)) != len(names):
            raise ValueError("duplicate retriever names")
        return names

    @field_validator("readers", mode="before")
    @classmethod
    def _reader_shapes(cls, entries: object) -> object:
        """Each mapping validated against its reader's own settings, one clear message per bad entry."""
        if not isinstance(entries, list):
            return entries
        out = []
        for i, e in enumerate(entries):
            if not isinstance(e, str | dict | ReaderEntry):
                raise ValueError(f"readers[{i}]: expected a reader name or a mapping {{name: ..., samples: ...}}, got {e!r}")
            parsed = e if isinstance(e, ReaderEntry) else ReaderEntry.parse(e, f"readers[{i}]")
            out.append(e if isinstance(e, str) else parsed)  # a name stays a name: the spec hash tells them apart
        keys = [e if isinstance(e, str) else e.key for e in out]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate reader entries: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
        return out

    def reader_entries(self) -> list[ReaderEntry]:
        return [ReaderEntry.parse(e) if isinstance(e, str) else e for e in self.readers]

    def reader_entry(self, key: str) -> ReaderEntry:
        """The reader entry whose label (`ReaderEntry.key`) is `key`."""
        if entries := [e for e in self.reader_entries() if e.key == key]:
            return entries[0]
        raise ValueError(f"no reader {key!r} in the spec; readers: {[e.key for e in self.reader_entries()]}")


class ExperimentSpec(_SpecBase):
    """One experiment: one dataset x retrievers x readers x model."""

    dataset: DatasetSpec = DatasetSpec()

    @model_validator(mode="after")
    def _gold_needs_gold_paragraphs(self) -> ExperimentSpec:
        from strategies.retrievers import uses_gold

        gold = [r for r in self.retrievers if uses_gold(r)]
        if gold and self.dataset.name != "squad":
            raise ValueError(f"retrievers: {gold[0]!r} inserts each question's gold paragraph, which only the 'squad' dataset "
                             f"knows (dataset.name is {self.dataset.name!r})")
        if gold and self.corpus.name != "squad-paragraphs":
            raise ValueError(f"retrievers: {gold[0]!r} takes the gold paragraph from the SQuAD paragraphs "
                             f"(corpus.name is {self.corpus.name!r})")
        return self

    def spec_hash(self) -> str:
        """Hash of everything that determines results (tracking locations excluded)."""
        payload = self.model_dump(exclude={"tracking", "description", "execution"})
        if not self.dataset.closed_book_filter:  # specs without the filter keep the hash they had before it existed
            payload["dataset"].pop("closed_book_filter")
        # likewise settings added later, unset: a corpus without a FAISS directory, a reader setting (ReaderEntry.hashed)
        payload["corpus"] = {k: v for k, v in payload["corpus"].items() if k != "faiss" or v is not None}
        payload["readers"] = [e if isinstance(e, str) else e.hashed() for e in self.readers]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def expand(self) -> list[ExperimentSpec]:
        return [self]


class SweepSpec(_SpecBase):
    """A spec whose `dataset` is a list: one ordinary experiment per dataset, named `<name>.<label>`, all logged to
    the same MLflow experiment (tracking.mlflow_experiment, default the sweep's name) so their grids sit side by side."""

    dataset: list[DatasetEntry] = Field(..., min_length=1)

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset_shapes(cls, entries: object) -> object:
        """One message per bad entry, naming it dataset[i]."""
        if not isinstance(entries, list):
            return entries
        if not entries:
            raise ValueError("an empty list: give one dataset mapping, or a list of at least one")
        out = []
        for i, e in enumerate(entries):
            if isinstance(e, DatasetEntry):
                out.append(e)
            elif isinstance(e, dict):
                out.append(_list_entry(DatasetEntry, e, f"dataset[{i}]"))
            else:
                raise ValueError(f"dataset[{i}]: expected a mapping {{name: ..., path: ...}}, got {e!r}")
        first: dict[str, int] = {}
        for i, e in enumerate(out):
            if e.key in first:
                raise ValueError(f"dataset[{i}].label: {e.key!r} is already the label of dataset[{first[e.key]}] "
                                 "(the label defaults to the dataset name; give each entry a distinct label)")
            first[e.key] = i
        return out

    @model_validator(mode="after")
    def _experiments_valid(self) -> SweepSpec:
        """Checks that depend on the dataset (e.g. gold(...) needs squad), per entry."""
        for i, e in enumerate(self.dataset):
            try:
                self._experiment(e)
            except ValidationError as exc:
                raise ValueError(f"dataset[{i}]: {pydantic_message(exc.errors()[0])}") from None
        return self

    def _experiment(self, entry: DatasetEntry) -> ExperimentSpec:
        shared = {k: getattr(self, k) for k in _SpecBase.model_fields if k not in ("name", "dataset", "tracking")}
        tracking = self.tracking.model_copy(update={"mlflow_experiment": self.tracking.mlflow_experiment or self.name})
        return ExperimentSpec(**shared, name=f"{self.name}.{entry.key}", dataset=entry.dataset(), tracking=tracking)

    def expand(self) -> list[ExperimentSpec]:
        """One experiment per dataset, in list order; each is an ordinary spec with its own hash and caches."""
        return [self._experiment(e) for e in self.dataset]


AnySpec = ExperimentSpec | SweepSpec


def _format_errors(path: str, exc: ValidationError) -> str:
    """Every error of the spec on one line, the file named once (the command's error is one line)."""
    return f"{path}: {'; '.join(field_errors(exc.errors()))}"


def parse_spec(data: object, source: str = "<spec>") -> AnySpec:
    """An ExperimentSpec when `dataset` is one mapping (or absent), a SweepSpec when it is a list."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a YAML mapping, got {type(data).__name__}")
    model = SweepSpec if isinstance(data.get("dataset"), list) else ExperimentSpec
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(source, exc)) from None


def load_spec(path: str | Path) -> AnySpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}:{where} malformed YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_spec(data, str(path))
