"""schemas/records.py `columns_of`: the column order of each record kind, read from its model's annotations."""

from __future__ import annotations

import subprocess
import sys

from schemas.records import RECORD_MODELS, columns_of


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
