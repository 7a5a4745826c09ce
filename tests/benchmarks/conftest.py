"""Benchmark results go to benchmark-results/<name>.json (git-ignored) as well as pytest-benchmark's own output,
so docs/performance.md can cite a file, not a terminal scroll-back."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmark-results"


@pytest.fixture(scope="module")
def record_result(request):
    """record_result(name, figures: dict) merges figures into benchmark-results/<module>.json."""
    path = RESULTS / f"{Path(request.module.__file__).stem.removeprefix('test_')}.json"

    def record(name: str, figures: dict) -> None:
        RESULTS.mkdir(exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = {**figures, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores"}
        path.write_text(json.dumps(data, indent=2))
        print(f"\n{name}: {json.dumps(figures)}  -> {path}")

    return record
