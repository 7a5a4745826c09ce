"""pandera models for every record kind stored in the event store.

Each record kind is an immutable event: the columns of `EventColumns` identify it, the rest is
its payload. `validate_records` is the one gate every batch passes before it is written.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
from typing import Any, Optional

import pandas as pd
import pandera.pandas as pa
from pandera.engines import pandas_engine
from pandera.typing import Series

from schemas.errors import RecordValidationError
from schemas.kinds import RECORD_KINDS

SCHEMA_VERSION = 1


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list | tuple) or (hasattr(value, "tolist") and not isinstance(value, str))


class EventColumns(pa.DataFrameModel):
    event_id: Series[str] = pa.Field(str_length={"min_value": 16}, unique=True)
    schema_version: Series[int] = pa.Field(ge=1)
    experiment: Series[str] = pa.Field(str_length={"min_value": 1})
    cell: Series[str]
    created_at: Series[pd.DatetimeTZDtype] = pa.Field(dtype_kwargs={"unit": "us", "tz": "UTC"})

    class Config:
        strict = True
        coerce = True


class QuestionRecord(EventColumns):
    qid: Series[str] = pa.Field(str_length={"min_value": 1})
    dataset: Series[str]
    question: Series[str] = pa.Field(str_length={"min_value": 1})
    answers: Series[object]
    gold_pids: Series[object]

    @pa.check("answers", name="non_empty_answer_list")
    def _answers(cls, s: Series[object]) -> Series[bool]:
        return s.map(lambda v: _is_str_list(v) and len(v) > 0 and all(isinstance(a, str) for a in v))

    @pa.check("gold_pids", name="list_of_passage_ids")
    def _gold(cls, s: Series[object]) -> Series[bool]:
        return s.map(_is_str_list)


class RetrievalRecord(EventColumns):
    qid: Series[str] = pa.Field(str_length={"min_value": 1})
    retriever: Series[str]
    rank: Series[int] = pa.Field(ge=1)
    pid: Series[str]
    score: Series[float] = pa.Field(nullable=True)
    title: Series[str]
    text: Series[str]
    text_hash: Series[str] = pa.Field(str_length={"min_value": 16})


class GenerationRecord(EventColumns):
    qid: Series[str] = pa.Field(str_length={"min_value": 1})
    retriever: Series[str]
    reader: Series[str]  # the spec's reader label (ReaderEntry.key), as in the cell name
    round: Series[int] = pa.Field(ge=1)
    role: Series[str]
    call_index: Series[int] = pa.Field(ge=0)
    sample_index: Series[int] = pa.Field(ge=0)
    call_id: Series[str] = pa.Field(str_length={"min_value": 16})
    prompt_version: Series[str]
    prompt_hash: Series[str] = pa.Field(str_length={"min_value": 16})
    system_prompt: Series[str]
    prompt: Series[str]
    passage_ids: Series[object]
    output: Series[str]
    parsed_answer: Series[str]
    parse_status: Series[str] = pa.Field(isin=["ok", "unmarked", "unparseable", "empty", "error"])
    logprob: Series[float] = pa.Field(nullable=True)
    # the parsed answer's arithmetic mean token probability (seed 003 MODULE-2), for calls that asked for
    # log-probabilities. Optional: segments written before it read it as null
    answer_prob: Optional[Series[float]] = pa.Field(nullable=True, ge=0, le=1)  # noqa: UP045 (pandera needs Optional here)
    # the whole output's arithmetic mean token probability, seed 003 §3.2.2's P(y | x) that MODULE-2 compares; optional
    # like answer_prob
    output_prob: Optional[Series[float]] = pa.Field(nullable=True, ge=0, le=1)  # noqa: UP045 (pandera needs Optional here)
    tokens_in: Series[int] = pa.Field(ge=0)
    tokens_out: Series[int] = pa.Field(ge=0)
    latency_ms: Series[float] = pa.Field(ge=0)
    model: Series[str]
    from_cache: Series[bool]
    retries: Series[int] = pa.Field(ge=0)

    @pa.check("passage_ids", name="list_of_passage_ids")
    def _pids(cls, s: Series[object]) -> Series[bool]:
        return s.map(_is_str_list)


class VoteRecord(EventColumns):
    qid: Series[str] = pa.Field(str_length={"min_value": 1})
    retriever: Series[str]
    reader: Series[str]
    method: Series[str]
    candidates: Series[object]
    scores: Series[object]
    chosen: Series[str]

    @pa.check("candidates", name="list_of_candidates")
    def _candidates(cls, s: Series[object]) -> Series[bool]:
        return s.map(_is_str_list)


ERROR_TYPES = [
    "correct",
    "lucky_guess",
    "retrieval_failure",
    "extraction_error",
    "hallucination_error",
    "abstention",
]


class OutcomeRecord(EventColumns):
    qid: Series[str] = pa.Field(str_length={"min_value": 1})
    retriever: Series[str]
    reader: Series[str]
    model: Series[str]
    prediction: Series[str]
    em: Series[float] = pa.Field(ge=0, le=1)
    f1: Series[float] = pa.Field(ge=0, le=1)
    semantic_match: Series[float] = pa.Field(nullable=True)
    is_unknown: Series[bool]
    # a gold answer occurs in the context the reader saw in its final round (seed 002's decomposition): the
    # cell's retrieval, or the feedback documents of a reader that retrieves its own (REFEED)
    gold_in_context: Series[bool]
    # the answer pool (the vote's candidates, or the one answer) holds a correct answer (seed 001's %NM);
    # null in segments written before a single answer counted as a one-answer pool
    pool_has_correct: Series[bool] = pa.Field(nullable=True)
    # a gold answer occurs in the cell's own retrieval (Recall@k). Optional: older segments read it as null
    gold_in_retrieval: Optional[Series[bool]] = pa.Field(nullable=True)  # noqa: UP045 (pandera needs Optional here)
    # a gold answer occurs in the feedback documents the reader retrieved itself (REFEED's refine call: Q+A, or
    # Q+A1..An with MODULE-1); null for readers without feedback retrieval. Optional: segments written before
    # the column existed stay valid and read it as null.
    gold_in_feedback: Optional[Series[bool]] = pa.Field(nullable=True)  # noqa: UP045 (pandera needs Optional here)
    error_type: Series[str] = pa.Field(isin=ERROR_TYPES)
    tokens_in: Series[int] = pa.Field(ge=0)
    tokens_out: Series[int] = pa.Field(ge=0)
    llm_calls: Series[int] = pa.Field(ge=0)


RECORD_MODELS: dict[str, type[EventColumns]] = dict(
    zip(RECORD_KINDS, (QuestionRecord, RetrievalRecord, GenerationRecord, VoteRecord, OutcomeRecord), strict=True))


# a column's earlier name -> its name now: a segment may hold the reader column as `strategy`. Segments are never
# rewritten, so whatever reads them renames (`current_names`, EventStore.read, the views of tracking/store/query.py)
RENAMED_COLUMNS = {"strategy": "reader"}


def current_names(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with each column of an earlier name (RENAMED_COLUMNS) under its name now. A frame holding both names
    (rows of older and newer segments side by side) gets one column, at the first of the two places, each row's
    value from whichever of the two it has."""
    for old, new in RENAMED_COLUMNS.items():
        if old not in df.columns:
            continue
        if new not in df.columns:
            df = df.rename(columns={old: new})
            continue
        cols = list(df.columns)
        first = min(cols.index(old), cols.index(new))
        merged = df[new].where(df[new].notna(), df[old])
        df = df.drop(columns=[old, new])
        df.insert(min(first, len(df.columns)), new, merged)
    return df


def validate_records(kind: str, df: pd.DataFrame) -> pd.DataFrame:
    """Validate a batch against its schema, or raise naming kind, column, check and offending rows. Columns of an
    earlier name (a segment written before the rename) are validated, and returned, under their name now."""
    df = current_names(df)
    schema = schema_of(kind)
    ready = _with_dtypes_of(schema, df)
    if ready is not None:  # coercing every column would change nothing more, and is a third of a batch's validation
        df, schema = ready, _without_coercion(kind)
    try:
        return schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as exc:
        cases = exc.failure_cases
        lines = [f"{kind}: {len(cases)} schema failure(s); nothing was written"]
        for _, case in cases.head(8).iterrows():
            lines.append(
                f"  column={case.get('column')!s} check={case.get('check')!s} "
                f"row={case.get('index')!s} value={str(case.get('failure_case'))[:80]!r}"
            )
        raise RecordValidationError("\n".join(lines)) from None


_schemas: dict[str, pa.DataFrameSchema] = {}
_schemas_lock = threading.Lock()


def schema_of(kind: str) -> pa.DataFrameSchema:
    """The pandera schema of a record kind, built once per process. `DataFrameModel.to_schema()` builds one per
    model and thread (Prefect runs each task on a thread of its pool), and to build one pandera asks whether a field
    is a Dask, Modin, PySpark or GeoPandas series or index by importing each that is installed: dask.dataframe, 0.7 s
    of CPU in a run that uses no Dask. These models' fields are pandas series, so the question is answered as
    pandas' alone while they are built (the schemas are the same either way: tests/test_record_columns.py)."""
    schema = _schemas.get(kind)
    if schema is None:
        import pandera.api.pandas.model as pandas_model
        from pandera.typing import Index

        pandas_only = {"get_index_types": lambda: {Index}, "get_series_types": lambda: {Series}}
        with _schemas_lock:
            schema = _schemas.get(kind)  # built by another thread while this one waited for the lock
            if schema is None:
                saved = {name: getattr(pandas_model, name) for name in pandas_only if hasattr(pandas_model, name)}
                try:
                    for name in saved:
                        setattr(pandas_model, name, pandas_only[name])
                    schema = RECORD_MODELS[kind].to_schema()
                finally:
                    for name, function in saved.items():
                        setattr(pandas_model, name, function)
                for column in schema.columns.values():
                    if type(column.dtype) is pandas_engine.STRING:
                        column.dtype = _String(column.dtype.storage)
                _schemas[kind] = schema
    return schema


def _with_dtypes_of(schema: pa.DataFrameSchema, df: pd.DataFrame) -> pd.DataFrame | None:
    """`df` with each column whose dtype is not its schema's coerced as pandera's coercion coerces it (the column
    dtype's `try_coerce`: a generation's `logprob` of Nones, an outcome's bools), the other columns as they are; None
    when a column is missing or does not coerce, for the validation with coercion to name. pandera's own coercion
    copies every column and assigns it back, even one already of its dtype."""
    columns = df.dtypes.to_dict()
    if any(name not in columns for name in schema.columns):
        return None
    wrong = [name for name, column in schema.columns.items() if columns[name] != column.dtype.type]
    try:
        return df.assign(**{name: schema.columns[name].dtype.try_coerce(df[name]) for name in wrong}) if wrong else df
    except (pa.errors.ParserError, TypeError, ValueError):  # what pandera's own coercion then reports, row by row
        return None


@functools.cache
def _without_coercion(kind: str) -> pa.DataFrameSchema:
    """`schema_of(kind)` checking every dtype, check and column as it does, without its coercion step."""
    schema = copy.deepcopy(schema_of(kind))
    schema.coerce = False
    return schema


@dataclasses.dataclass(frozen=True)
class _String(pandas_engine.STRING):
    """pandera's string dtype, answering a column of exactly that dtype with one True. pandera's own answers it with
    an array of Trues, which its dtype check takes for element-wise results: it then selects the failing rows (none),
    shapes them into a failure-case frame and formats that frame into a message, for every string column of every
    batch: more than half of a run's validation (docs/performance.md, "Small costs behind the code"). Any other
    column dtype is answered as pandera does."""

    def check(self, pandera_dtype, data_container=None):  # type: ignore[override]
        try:
            if pandas_engine.Engine.dtype(pandera_dtype).type == self.type:
                return True
        except TypeError:
            return False
        return super().check(pandera_dtype, data_container)


def columns_of(kind: str) -> list[str]:
    """Column order of a record kind: its model's `Series` fields, a base class's first, as pandera orders the
    model's schema (tests/test_record_columns.py compares the two for every kind). Read from the annotations rather than
    from a schema: the first model calls of a run are planned before any record is validated, and need not wait
    for pandera (`schema_of`)."""
    return list(_columns(RECORD_MODELS[kind]))


@functools.cache
def _columns(model: type[pa.DataFrameModel]) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, pa.DataFrameModel) and cls is not pa.DataFrameModel:
            names.update((n, None) for n, a in vars(cls).get("__annotations__", {}).items()
                         if str(a).startswith(("Series[", "Optional[Series[")))
    return tuple(names)
