"""The test tiers of infra/test.sh (tests/conftest.py SLOW, EXTENDED) and what each must keep: every test bounded
in time, every reader entry and retriever kind on the real model in the default tier (.ci/run)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import EXTENDED, SLOW

REPO = Path(__file__).resolve().parent.parent


def _pytest(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def test_every_test_has_a_time_limit_that_fails_it_by_name():
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < options["timeout"] <= 600 and options["timeout_method"] == "signal"


def test_a_hanging_test_fails_under_its_own_name_and_the_run_goes_on(tmp_path):
    """The repository's pytest configuration with a 2-second limit in place of the default."""
    (tmp_path / "test_hang.py").write_text("import time\n\n\ndef test_hangs():\n    time.sleep(600)\n\n\n"
                                           "def test_after_it():\n    pass\n")
    run = _pytest("-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2",
                  str(tmp_path / "test_hang.py"), cwd=tmp_path)
    assert run.returncode == 1, run.stdout[-2000:]
    assert "FAILED test_hang.py::test_hangs - Failed: Timeout (>2.0s)" in run.stdout, run.stdout[-2000:]
    assert "1 failed, 1 passed" in run.stdout


def test_every_tier_entry_names_a_test_that_exists():
    for entry in SLOW | EXTENDED:
        path, _, name = entry.partition("::")
        assert (REPO / path).is_file(), entry
        assert not name or re.search(rf"^(async )?def {name}\(", (REPO / path).read_text(), re.M), entry


def test_every_reader_entry_and_retriever_kind_meets_the_real_model_in_the_default_tier():
    from strategies.readers import READERS
    from strategies.retrievers import PLAIN, SOURCES, WRAPPERS
    from tests import test_real_model_strategies as real

    listed = _pytest("--collect-only", "-q", "-m", "not extended", "tests/test_real_model_strategies.py")
    for name in ("test_every_reader_strategy_runs_on_the_real_model", "test_every_retriever_kind_runs_on_the_real_model",
                 "test_the_gold_passage_setting_runs_on_the_real_model"):
        assert f"tests/test_real_model_strategies.py::{name}" in listed.stdout, listed.stdout[-2000:]
    covered = {entry if isinstance(entry, str) else entry["name"] for entry, _ in real.READERS}
    assert set(READERS) - covered == set(), "reader entries with no real-model case"
    kinds = {*SOURCES, *PLAIN, *WRAPPERS, "rerank"}
    used = set()
    for name in [*real.RETRIEVERS, real.GOLD]:
        used |= set(re.findall(r"[a-z_0-9]+", name)) & kinds
        used |= {"rerank"} if "@rr@" in name else set()
    assert kinds - used == set(), "retriever kinds with no real-model case"
