"""Benchmark results go to benchmark-results/<name>.json (git-ignored) as well as pytest-benchmark's own output,
so the README's performance table can cite a file, not a terminal scroll-back."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmark-results"
ORDER = ["test_analysis_bench.py", "test_flow_throughput.py"]  # then the rest, as collected


def pytest_collection_modifyitems(session, config, items):
    """Order: the analysis benchmark first, as its memory figure is the process's peak RSS (a process that has
    done nothing else); then the flow throughput benchmarks (P1, P2), before the BM25 one: run after it (which
    searches a second Lucene index in the same JVM), the P1 flow once measured 18.9 s with a 0.73 s prepare stage,
    against 18.0-18.5 s with a 0.08 s one before it. The rest as collected."""
    items.sort(key=lambda item: ORDER.index(item.path.name) if item.path.name in ORDER else len(ORDER))  # stable


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
