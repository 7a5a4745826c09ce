"""schemas/records.py `columns_of`: the column order of each record kind, read from its model's annotations."""

from __future__ import annotations

import subprocess
import sys

from schemas.records import RECORD_MODELS, RecordValidationError, columns_of


def test_columns_of_is_the_order_of_the_pandera_schema_for_every_kind():
    for kind, model in RECORD_MODELS.items():
        assert columns_of(kind) == list(model.to_schema().columns), kind


def test_columns_of_builds_no_schema_and_imports_no_dask():
    code = ("import sys; from schemas.records import columns_of, RECORD_MODELS; "
            "[columns_of(k) for k in RECORD_MODELS]; print('dask.dataframe' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_each_kind_has_one_schema_per_process_the_same_as_pandera_builds_and_no_dask_import():
    # the schema built with pandas' series and index types alone is the model's own schema, column by column
    code = ("import sys, threading; from schemas.records import RECORD_MODELS, schema_of; "
            "built = {k: schema_of(k) for k in RECORD_MODELS}; other = []; "
            "t = threading.Thread(target=lambda: other.extend(schema_of(k) for k in RECORD_MODELS)); t.start(); t.join(); "
            "print('dask.dataframe' in sys.modules, all(a is b for a, b in zip(built.values(), other)), "
            "all(repr(built[k].columns) == repr(m.to_schema().columns) and built[k].index == m.to_schema().index "
            "for k, m in RECORD_MODELS.items()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True", "True"]


def test_a_string_column_is_checked_without_failure_cases_and_validates_as_pandera_own_dtype_does():
    import pandas as pd
    import pytest
    from pandera.backends.pandas.array import ArraySchemaBackend

    from schemas.records import schema_of, validate_records
    from tracking.store.events import new_events

    rows = [{"event_id": f"{i:032d}", "cell": "bm25@1", "qid": f"q{i}", "retriever": "bm25@1", "rank": 1, "pid": "p",
             "score": 1.0, "title": "t", "text": "x", "text_hash": "0" * 32} for i in range(3)]
    df = new_events("retrievals", "exp", rows)
    results = []
    original = ArraySchemaBackend.check_dtype
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ArraySchemaBackend, "check_dtype",
                   lambda self, obj, schema: results.append((obj.name, original(self, obj, schema))) or results[-1][1])
        validate_records("retrievals", df)
    strings = {name: r for name, r in results if pd.api.types.is_string_dtype(df[name])}
    assert set(strings) == {"event_id", "experiment", "cell", "qid", "retriever", "pid", "title", "text", "text_hash"}
    assert all(r.passed is True and r.failure_cases is None for r in strings.values())
    # what needs coercing comes out as from pandera's own string dtype; what cannot pass fails as there
    own = RECORD_MODELS["retrievals"].to_schema()
    mixed = df.assign(pid=pd.Series([7, "p", 8], dtype=object))
    pd.testing.assert_frame_equal(schema_of("retrievals").validate(mixed), own.validate(mixed))
    with pytest.raises(RecordValidationError, match="event_id"):
        validate_records("retrievals", df.assign(event_id=["short", "x" * 32, "y" * 32]))


def test_a_batch_is_validated_without_pandera_coercion_and_gives_what_coercion_gives():
    """schemas/records.py `validate_records`: the columns not of their schema's dtype are coerced alone, as pandera's
    coercion would; the batch then validates without pandera's coercion step, to the same frame."""
    import pandas as pd
    import pytest
    from pandera.backends.pandas.container import DataFrameSchemaBackend

    from schemas.records import schema_of, validate_records
    from tracking.store.events import new_events

    rows = [{"event_id": f"{i:032d}", "cell": "bm25@1", "qid": f"q{i}", "retriever": "bm25@1", "rank": 1, "pid": "p",
             "score": 1.0, "title": "t", "text": "x", "text_hash": "0" * 32} for i in range(3)]
    ready = new_events("retrievals", "exp", rows)  # as a stage makes it: every column of its schema's dtype
    generation = {"event_id": "0" * 32, "cell": "c", "qid": "q1", "retriever": "bm25@1", "reader": "concatenation",
                  "round": 1, "role": "answer", "call_index": 0, "sample_index": 0, "call_id": "1" * 16,
                  "prompt_version": "v", "prompt_hash": "2" * 16, "system_prompt": "", "prompt": "p",
                  "passage_ids": ["p1"], "output": "o", "parsed_answer": "o", "parse_status": "ok", "logprob": None,
                  "answer_prob": None, "output_prob": None, "tokens_in": 3, "tokens_out": 1, "latency_ms": 2.0,
                  "model": "m", "from_cache": False, "retries": 0}
    built = new_events("generations", "exp", [generation, {**generation, "event_id": "1" * 32, "qid": "q2"}])
    assert built["logprob"].dtype == object  # Nones, as a run without log-probabilities makes them
    batches = [("retrievals", ready), ("retrievals", ready.assign(rank=ready["rank"].astype("int32"))),
               ("generations", built)]
    coerced = []
    original = DataFrameSchemaBackend._coerce_dtype_helper
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DataFrameSchemaBackend, "_coerce_dtype_helper",
                   lambda self, obj, schema: coerced.append(len(obj)) or original(self, obj, schema))
        fast = [validate_records(kind, df) for kind, df in batches]
        assert coerced == []
        with pytest.raises(RecordValidationError, match="rank"):  # a column that does not coerce: pandera's coercion names it
            validate_records("retrievals", ready.assign(rank=["1", "one", "2"]))
        assert coerced == [3]
    for (kind, df), got in zip(batches, fast, strict=True):
        pd.testing.assert_frame_equal(got, schema_of(kind).validate(df), check_exact=True)
    assert fast[1]["rank"].dtype == "int64" and fast[2]["logprob"].dtype == "float64"
    # a failing check still fails on the way without coercion
    with pytest.raises(RecordValidationError, match="rank"):
        validate_records("retrievals", ready.assign(rank=[1, 0, 2]))
