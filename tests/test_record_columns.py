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
