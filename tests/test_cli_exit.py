"""The `ragledger` command's own exit (ragledger/cli.py `main`): after its atexit handlers it ends with os._exit,
skipping the interpreter's teardown. Its output must still arrive whole and its status must still say what happened.
The other CLI tests call the typer app in-process; these run the installed command as a user does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RAGLEDGER = Path(sys.executable).parent / "ragledger"


def ragledger(*args: str, cwd: Path, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([str(RAGLEDGER), *args], cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


def test_the_whole_output_arrives_through_a_pipe_and_success_is_status_0(tmp_path):
    done = ragledger("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout and "store" in done.stdout and done.stdout.rstrip().endswith("─╯")


def test_a_user_error_keeps_its_status_and_its_one_line(tmp_path):
    done = ragledger("run", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and "missing.yaml" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / ".ragledger").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_that_cannot_be_written_fails_the_command(tmp_path):
    with open("/dev/full", "w") as full:
        done = ragledger("--help", cwd=tmp_path, stdout=full)
    assert done.returncode != 0


def test_a_flush_that_fails_at_the_exit_turns_success_into_status_120(monkeypatch):
    """What the interpreter's own exit does when stdout cannot be flushed; os._exit would otherwise say 0."""
    from ragledger import cli

    class Unwritable:
        def flush(self) -> None:
            raise OSError(28, "No space left on device")

    statuses: list[int] = []
    monkeypatch.setattr(cli.os, "_exit", statuses.append)
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)  # pytest's own handlers stay open
    monkeypatch.setattr(cli.sys, "stdout", Unwritable())
    for status, expected in ((0, 120), (2, 2)):
        monkeypatch.setattr(cli, "_exit_status", status)
        cli._exit_without_teardown()
        assert statuses.pop() == expected
    monkeypatch.setattr(cli, "_exit_status", None)  # an uncaught exception: the usual exit, no os._exit
    cli._exit_without_teardown()
    assert statuses == []


def test_scoring_predictions_from_a_missing_file_is_one_line(tmp_path, data_dir):
    done = ragledger("eval-predictions", str(data_dir / "squad" / "dev-v1.1.json.gz"), str(tmp_path / "nope.json"),
                     cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path / 'nope.json'}: file not found"


def test_scoring_a_few_predictions_says_how_many_questions_went_unanswered_in_one_line(tmp_path, data_dir):
    preds = tmp_path / "preds.json"
    preds.write_text('{"Super_Bowl_50_0_0": "Denver Broncos"}')
    done = ragledger("eval-predictions", str(data_dir / "squad" / "dev-v1.1.json.gz"), str(preds), cwd=tmp_path)
    assert done.returncode == 0 and '"exact_match"' in done.stdout
    assert done.stderr.strip().splitlines() == [f"10,569 of 10,570 questions unanswered (e.g. {_first_qid(data_dir)}): "
                                                "each scores 0, as in the official script"]


def _first_qid(data_dir) -> str:
    from core.datasets import load_squad

    return next(q.qid for q in load_squad(data_dir / "squad" / "dev-v1.1.json.gz") if q.qid != "Super_Bowl_50_0_0")
