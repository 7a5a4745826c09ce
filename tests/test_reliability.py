"""Reliability: bad input, crash and resume, a backend that is down, concurrent experiments, store
integrity, secrets. Experiments run through the CLI as separate processes against a scripted
OpenAI-compatible server (the test tool standing in for vLLM/OpenAI)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer

RAGLEDGER = str(Path(sys.executable).parent / "ragledger")
TOPICS = ["Broncos", "Paris", "Everest", "Nile", "Amazon", "Sahara", "Danube", "Andes", "Alps", "Gobi"]


def make_data(ws: Path, n_questions: int = 24) -> None:
    passages = [{"id": f"p{i}", "title": t, "text": f"{t} is item number {i}. The {t} entry mentions fact {i}."}
                for i, t in enumerate(TOPICS)]
    (ws / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    qs = [{"id": f"q{i}", "question": f"Which entry mentions fact {i % len(TOPICS)} about {TOPICS[i % len(TOPICS)]}?",
           "answers": [TOPICS[i % len(TOPICS)]]} for i in range(n_questions)]
    (ws / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))


def reader(system: str, prompt: str, body: dict) -> str:
    context = prompt.split("Question:")[0]
    return next((t for t in TOPICS if t in context), "unknown")


def write_spec(ws: Path, base_url: str, name: str = "rel", compact: bool = True, **model) -> Path:
    """A spec over make_data's files; `compact=False` keeps the run's segments as written (a check that counts the
    events of every segment file, like `raw_event_counts`, then sees what the run wrote, not its compacted pack)."""
    spec = {
        "name": name,
        "dataset": {"name": "jsonl", "path": str(ws / "questions.jsonl")},
        "corpus": {"name": "jsonl", "paths": [str(ws / "corpus.jsonl")]},
        "retrievers": ["bm25@2"],
        "readers": ["concatenation", "post_fusion"],
        "model": {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 2, **model},
        "execution": {"shard_size": 4},
        "tracking": {"compact": compact},
    }
    path = ws / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def cli(ws: Path, *args: str, env: dict | None = None, timeout: int = 600, prefix: tuple[str, ...] = (),
        own_prefect: bool = False) -> subprocess.CompletedProcess:
    """Run the CLI in its own process group. Output goes to files, not pipes: after a SIGKILL the CLI's
    child (Prefect's temporary API server) would hold a pipe open; the whole group is killed at the end.
    `prefix` runs it through another command (setpriv, to run it as another user). The command reports to the
    pytest run's Prefect API (tests/conftest.py `shared_prefect_api`) unless `own_prefect`: then it starts its own
    temporary server, as a user's command does."""
    import signal
    import tempfile

    base = prefect_env(own_prefect)
    base["RAGLEDGER_INDEX_DIR"] = str(ws / "indexes")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*prefix, RAGLEDGER, *args], cwd=ws, env={**base, **(env or {})}, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, code, out.read(), err.read())


def prefect_env(own_prefect: bool = False) -> dict[str, str]:
    """This environment for a CLI command: Prefect's variables left out (the command keeps its Prefect home in its
    workspace), and the pytest run's Prefect API unless the command is to start its own."""
    from tests.conftest import shared_prefect_api

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env if own_prefect else {**env, "PREFECT_API_URL": shared_prefect_api()}


def outcome_table(ws: Path) -> list[tuple]:
    from tracking.store.query import query

    df = query(ws / ".ragledger" / "store", "SELECT cell, qid, prediction, em, f1, error_type FROM outcomes ORDER BY cell, qid")
    return [tuple(r) for r in df.itertuples(index=False)]


def raw_event_counts(ws: Path) -> dict[str, tuple[int, int]]:
    """(rows over all segment files, distinct event ids) per kind, read without the views' dedup. For a store whose
    runs kept their segments (`write_spec(..., compact=False)`): a pack holds each event once by construction."""
    import duckdb

    out = {}
    for kind in ("questions", "retrievals", "generations", "votes", "outcomes"):
        files = list((ws / ".ragledger" / "store" / kind).glob("*/seg-*.parquet"))
        assert not list((ws / ".ragledger" / "store" / kind).glob("*/pack-*.parquet")), "count a store not compacted"
        if files:
            sql = f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet({[str(f) for f in files]})"
            n, d = duckdb.sql(sql).fetchall()[0]
            out[kind] = (n, d)
    assert out, f"no segment under {ws}"
    return out


# ---- bad input -------------------------------------------------------------------------------------

BAD_INPUTS = {
    "malformed YAML": ("spec", "name: [oops\n", "malformed YAML"),
    "unknown field": ("spec_patch", {"colour": 1}, "field 'colour': unknown field"),
    "unknown retriever": ("spec_patch", {"retrievers": ["bm99@3"]}, "unknown retriever 'bm99'"),
    "unknown strategy": ("spec_patch", {"readers": ["telepathy"]}, "unknown reader strategy 'telepathy'"),
    "k <= 0": ("spec_patch", {"retrievers": ["bm25@0"]}, "k must be a positive integer"),
    "wrong type": ("spec_patch", {"model": {"backend": "openai", "base_url": "http://x/v1", "temperature": "hot"}},
                   "field 'model.temperature'"),
    "missing dataset file": ("spec_patch", {"dataset": {"name": "jsonl", "path": "/nonexistent/q.jsonl"}},
                             "rel.yaml: dataset.path: /nonexistent/q.jsonl: file not found"),
    "empty question": ("questions", [{"question": " ", "answers": ["a"]}], "row 1: field 'question' is empty"),
    "row without answers": ("questions", [{"question": "q?", "answers": ["a"]}, {"question": "r?"}],
                            "row 2: field 'answers' has no answers"),
    "duplicate ids": ("questions", [{"id": "a", "question": "q?", "answers": ["x"]},
                                    {"id": "a", "question": "r?", "answers": ["y"]}],
                      "row 2: field 'id': duplicate id 'a'"),
    "non-UTF-8 bytes": ("questions_bytes", b'{"question": "caf\xe9?", "answers": ["x"]}\n', "not valid UTF-8"),
    "missing corpus": ("spec_patch", {"corpus": {"name": "jsonl", "paths": ["/nonexistent/corpus.jsonl"]}},
                       "rel.yaml: corpus.paths: /nonexistent/corpus.jsonl: file not found"),
    "missing API key variable": ("spec_patch", {"model": {"backend": "openai", "base_url": "http://x/v1",
                                                          "api_key_env": "RAGLEDGER_TEST_NO_SUCH_KEY"}},
                                 "rel.yaml: model.api_key_env names 'RAGLEDGER_TEST_NO_SUCH_KEY'"),
    "unknown embedded model": ("spec_patch", {"model": {"embedded_model": "qwen-7b-nope"}},
                               "rel.yaml: model.embedded_model: unknown embedded model 'qwen-7b-nope'; known: "),
    "two bad values": ("spec_patch", {"dataset": {"name": "jsonl", "path": "q.jsonl", "limit": -3},
                                      "model": {"backend": "openai", "base_url": "http://x/v1", "max_tokens": 99999}},
                       "field 'dataset.limit': Input should be greater than 0, got -3; field 'model.max_tokens'"),
    "a typo of a required field": ("spec_patch", {"retrievers": None, "retriever": ["bm25@3"]},  # None: left out
                                   "field 'retriever': unknown field (did you mean 'retrievers'?)"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_error_and_writes_nothing(tmp_path, case):
    kind, payload, needle = BAD_INPUTS[case]
    make_data(tmp_path, 4)
    spec_path = write_spec(tmp_path, "http://127.0.0.1:9/v1")
    if kind == "spec":
        spec_path.write_text(payload)
    elif kind == "spec_patch":
        spec = yaml.safe_load(spec_path.read_text())
        spec.update(payload)
        spec_path.write_text(yaml.safe_dump({k: v for k, v in spec.items() if v is not None}))
    elif kind == "questions":
        (tmp_path / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in payload))
    elif kind == "questions_bytes":
        (tmp_path / "questions.jsonl").write_bytes(payload)
    proc = cli(tmp_path, "run", str(spec_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == 1 and needle in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == error_lines[0], proc.stderr  # no line of it after the error line
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / ".ragledger").exists()  # nothing written: no store, no MLflow, no Prefect home
    print(f"{case}: {error_lines[0]}")


# ---- crash and resume ------------------------------------------------------------------------------

CRASH_POINTS = ["retrieve.done:1", "generate.call:7", "events.before_rename:5", "generate.call:31", "mlflow.log:3"]


def test_kill_9_at_five_points_then_resume_gives_the_uninterrupted_result(tmp_path):
    killed_at_points_then_resumed(tmp_path, CRASH_POINTS, {})


def test_kill_9_of_a_run_that_records_after_its_table_then_resume_gives_the_uninterrupted_result(tmp_path):
    """The same on the route `ragledger run` takes by default (flows/direct.py), whose process logs nothing to
    MLflow (its recorder does, after the table)."""
    points = [p for p in CRASH_POINTS if not p.startswith("mlflow.")]
    killed_at_points_then_resumed(tmp_path, points, {"RAGLEDGER_FOREGROUND": "0"})


def killed_at_points_then_resumed(tmp_path: Path, points: list[str], env: dict[str, str]) -> None:
    clean_ws, crash_ws = tmp_path / "clean", tmp_path / "crash"
    for ws in (clean_ws, crash_ws):
        ws.mkdir()
        make_data(ws)
    with ScriptedServer(answer=reader, delay_s=0.02) as clean_server:
        proc = cli(clean_ws, "run", str(write_spec(clean_ws, clean_server.base_url)), env=env)
        assert proc.returncode == 0, proc.stderr
    # a first run in a new directory (a new index, a new MLflow store) says nothing of its libraries' bookkeeping
    for noise in ("INFO mlflow", "MMapDirectory", "SLF4J("):
        assert noise not in proc.stdout + proc.stderr, (noise, proc.stdout[-2000:], proc.stderr[-2000:])
    expected = outcome_table(clean_ws)
    assert len(expected) == 2 * 24

    with ScriptedServer(answer=reader, delay_s=0.02) as server:
        spec = write_spec(crash_ws, server.base_url, compact=False)  # the segments as the resumed runs wrote them
        killed = 0
        for point in points:
            proc = cli(crash_ws, "run", str(spec), env={**env, "RAGLEDGER_CRASH_AT": point})
            assert proc.returncode == -9, f"{point}: expected SIGKILL, got {proc.returncode}\n{proc.stderr[-2000:]}"
            killed += 1
        final = cli(crash_ws, "run", str(spec), env=env)
        assert final.returncode == 0, final.stderr
        assert outcome_table(crash_ws) == expected
        for kind, (rows, distinct) in raw_event_counts(crash_ws).items():
            assert rows == distinct, f"{kind}: {rows - distinct} duplicate events"
        # a completed call (answered and cached) is never asked again; only calls in flight at a kill may repeat
        keys = [json.dumps(r["messages"]) + str(r.get("seed")) for r in server.requests]
        repeated = len(keys) - len(set(keys))
        assert repeated <= killed * 2, repeated  # concurrency 2
        assert len(set(keys)) == clean_server.calls
        verify = cli(crash_ws, "store", "verify")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        print(f"kills survived: {killed}; calls {len(keys)} (unique {len(set(keys))}, repeated in-flight {repeated})")
    if env.get("RAGLEDGER_FOREGROUND") == "0":  # the final run's recorder logs it (the killed runs left no manifest)
        pending = crash_ws / ".ragledger" / "store" / "mlflow-pending"
        deadline = time.monotonic() + 180
        while list(pending.rglob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not list(pending.rglob("*.json")), "the final run's recorder did not log it to MLflow"


# ---- backend down, concurrency, integrity, secrets ---------------------------------------------------

def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The run's single `error:` line, checked to be the last line, with no traceback or Prefect noise around it."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("SLF4J")]  # the JVM's banner
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error logging to API" not in proc.stderr, proc.stderr[-3000:]
    assert " | ERROR " not in proc.stderr, proc.stderr[-3000:]  # Prefect's failed task/flow-run records
    return errors[0]


def test_backend_down_is_a_clear_error_and_resumable(tmp_path):
    make_data(tmp_path, 8)
    spec = write_spec(tmp_path, "http://127.0.0.1:9/v1", max_retries=2, timeout_s=2)
    t = time.perf_counter()
    proc = cli(tmp_path, "run", str(spec))
    elapsed = time.perf_counter() - t
    # one line naming the endpoint and the cause (the run may end on the first give-up, or on a call the breaker
    # failed at once, which names the same attempts); the tracebacks are in the run log the line names
    line = one_error_line(proc)
    assert proc.returncode == 2 and "after 3 attempts" in line and "APIConnectionError" in line, line
    assert "127.0.0.1:9/v1" in line
    log = tmp_path / line.rsplit("traceback in ", 1)[1]
    assert log.parent == tmp_path / ".ragledger" / "logs" and "Traceback" in log.read_text()
    assert "Task run failed with exception" in log.read_text()  # Prefect's task-run records went there
    assert elapsed < 120
    # progress kept: the retrieval segments are stored (a failed run compacts nothing), and the next run (backend
    # up) resumes from them
    assert list((tmp_path / ".ragledger" / "store" / "retrievals").glob("*/seg-*.parquet"))
    with ScriptedServer(answer=reader) as server:
        data = yaml.safe_load(spec.read_text())
        data["model"]["base_url"] = server.base_url
        spec.write_text(yaml.safe_dump(data))
        proc = cli(tmp_path, "run", str(spec))
        assert proc.returncode == 0, proc.stderr
    print(f"backend down: failed in {elapsed:.1f} s with: {line}")


@pytest.mark.slow
def test_four_experiments_at_once_on_one_store_and_mlflow(tmp_path):
    make_data(tmp_path, 12)
    with ScriptedServer(answer=reader, delay_s=0.01) as server:
        specs = [write_spec(tmp_path, server.base_url, name=f"exp{i}", compact=False) for i in range(4)]
        base = prefect_env()
        base["RAGLEDGER_INDEX_DIR"] = str(tmp_path / "indexes")
        procs = [subprocess.Popen([RAGLEDGER, "run", str(s)], cwd=tmp_path, env=base, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for s in specs]
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err[-3000:]
        # the four share one LLM-call cache: identical prompts were asked once across all of them
        keys = [json.dumps(r["messages"]) for r in server.requests]
        assert len(keys) - len(set(keys)) <= 4 * 2
    for kind, (rows, distinct) in raw_event_counts(tmp_path).items():
        assert rows == distinct, kind
    from tracking.store.query import query

    per_exp = query(tmp_path / ".ragledger" / "store", "SELECT experiment, count(*) AS n FROM outcomes GROUP BY experiment")
    assert sorted(per_exp["n"]) == [24, 24, 24, 24]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / '.ragledger' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=[f"exp{i}" for i in range(4)], output_format="list")
    assert len([r for r in runs if r.data.tags.get("ragledger.level") == "experiment"]) == 4
    assert all(r.info.status == "FINISHED" for r in runs)
    assert cli(tmp_path, "store", "verify").returncode == 0


def test_store_verify_names_a_damaged_segment(tmp_path):
    make_data(tmp_path, 4)
    with ScriptedServer(answer=reader) as server:
        assert cli(tmp_path, "run", str(write_spec(tmp_path, server.base_url))).returncode == 0
    seg = sorted((tmp_path / ".ragledger" / "store" / "outcomes").glob("*/pack-*.parquet"))[0]  # the run compacted
    seg.write_bytes(seg.read_bytes()[:-40])
    proc = cli(tmp_path, "store", "verify")
    assert proc.returncode == 1 and str(seg) in proc.stderr


# ---- store and other locations: checked before the run ------------------------------------------------

LOCATIONS = {  # case -> (spec patch, extra CLI args, env, text the error line must hold); {ws} is the workspace
    "store is a file": ({"tracking": {"store": "{ws}/afile"}}, (), {}, "tracking.store: {ws}/afile is a file, not a directory"),
    "store under a file": ({"tracking": {"store": "{ws}/afile/store"}}, (), {},
                           "tracking.store: cannot create {ws}/afile/store: {ws}/afile is a file"),
    "--store is a file": ({}, ("--store", "{ws}/afile"), {}, "--store: {ws}/afile is a file, not a directory"),
    "MLflow database under a file": ({"tracking": {"mlflow_uri": "sqlite:///{ws}/afile/mlflow.db"}}, (), {},
                                     "tracking.mlflow_uri: cannot create {ws}/afile/mlflow.db: {ws}/afile is a file"),
    "MLflow database is a directory": ({"tracking": {"mlflow_uri": "sqlite:///{ws}/adir"}}, (), {},
                                       "tracking.mlflow_uri: {ws}/adir is a directory, not a file"),
    "index directory is a file": ({}, (), {"RAGLEDGER_INDEX_DIR": "{ws}/afile"},
                                  "RAGLEDGER_INDEX_DIR: {ws}/afile is a file, not a directory"),
    "--json under a file": ({}, ("--json", "{ws}/afile/summary.json"), {},
                            "--json: cannot create {ws}/afile/summary.json: {ws}/afile is a file"),
}


@pytest.mark.parametrize("case", list(LOCATIONS))
def test_an_unusable_location_is_one_clear_error_before_anything_starts(tmp_path, case):
    patch, args, env, needle = LOCATIONS[case]
    make_data(tmp_path, 4)
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "adir").mkdir()
    spec_path = write_spec(tmp_path, "http://127.0.0.1:9/v1")
    spec = yaml.safe_load(spec_path.read_text())
    spec.update(json.loads(json.dumps(patch).replace("{ws}", str(tmp_path))))
    spec_path.write_text(yaml.safe_dump(spec))
    proc = cli(tmp_path, "run", str(spec_path), *(a.replace("{ws}", str(tmp_path)) for a in args),
               env={k: v.replace("{ws}", str(tmp_path)) for k, v in env.items()})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert needle.replace("{ws}", str(tmp_path)) in line, line
    assert not (tmp_path / ".ragledger").exists()  # checked before Prefect, MLflow or the store were started
    assert (tmp_path / "afile").read_text() == "not a directory" and not any((tmp_path / "adir").iterdir())
    print(f"{case}: {line}")


def test_a_json_summary_in_a_folder_still_to_be_made_is_written_there(tmp_path):
    """--json is checked with the other locations: a folder still to be made is made when it is written, as the
    store's is (no FileNotFoundError after a whole run)."""
    make_data(tmp_path, 4)
    out = tmp_path / "reports" / "today" / "summary.json"
    with ScriptedServer(answer=reader) as server:
        proc = cli(tmp_path, "run", str(write_spec(tmp_path, server.base_url)), "--json", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert json.loads(out.read_text())["experiment"] == "rel"


def test_an_unwritable_store_is_one_clear_error_before_anything_starts():
    """The store directory exists but this user may not write it (root may write anywhere: the CLI then runs as
    nobody). Permission bits are not what is checked: a file is created and removed in it."""
    import shutil
    import tempfile

    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot run the CLI as a user the store refuses")
        prefix = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    ws = Path(tempfile.mkdtemp(prefix="ragledger-unwritable-"))
    try:
        ws.chmod(0o755)
        make_data(ws, 4)
        store = ws / "store"
        store.mkdir()
        store.chmod(0o555)
        spec_path = write_spec(ws, "http://127.0.0.1:9/v1")
        spec = yaml.safe_load(spec_path.read_text())
        spec["tracking"] = {"store": str(store)}
        spec_path.write_text(yaml.safe_dump(spec))
        for f in ws.iterdir():
            f.chmod(0o644 if f.is_file() else 0o555)
        proc = cli(ws, "run", str(spec_path), prefix=prefix)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        line = one_error_line(proc)
        assert f"tracking.store: {store} is not writable: Permission denied" in line, line
        assert not (ws / ".ragledger").exists() and not any(store.iterdir())
    finally:
        store.chmod(0o755)
        shutil.rmtree(ws)


# ---- credentials ---------------------------------------------------------------------------------------

def test_a_client_side_failure_is_not_retried_and_not_called_malformed():
    """A URL with credentials, given to the client directly (the specs refuse it): the aiohttp transport refuses
    it beside the Authorization header before anything is sent. Not a malformed response, not retried (7 attempts
    with backoff, before), and the password is not in the error."""
    from engines.llm import BackendError, LLMClient, LLMRequest, run_on_engine
    from engines.llm_types import Endpoint

    password = "pw-client-" + "".join(random.choices("abcdef0123456789", k=12))
    with ScriptedServer(answer=reader) as server:
        url = server.base_url.replace("http://", f"http://user:{password}@")
        client = LLMClient(Endpoint(url, "scripted", max_retries=6), model_identity="x", cache=None)
        t = time.perf_counter()
        with pytest.raises(BackendError) as caught:
            run_on_engine(client.complete(LLMRequest("s", "Question: q?", 0.0, 1.0, 8, 0)))
        elapsed = time.perf_counter() - t
        assert server.calls == 0
    message = str(caught.value)
    assert "client-side ValueError, not retried" in message and "malformed" not in message, message
    assert password not in message and "http://***@127.0.0.1" in message, message
    assert elapsed < 5, elapsed  # 6 retries with backoff took ~30 s


CREDENTIALS = {  # where the secret goes -> (spec patch, CLI args, env, what the error line names)
    "model.base_url": ({"model": {"backend": "openai", "name": "scripted", "base_url": "http://user:{pw}@127.0.0.1:9/v1"}},
                       (), {}, "model.base_url"),
    "--base-url": ({}, ("--base-url", "http://user:{pw}@127.0.0.1:9/v1"), {}, "--base-url: http://***@127.0.0.1:9/v1"),
    "tracking.mlflow_uri": ({"tracking": {"mlflow_uri": "postgresql://mlflow:{pw}@127.0.0.1:1/mlflow"}}, (), {},
                            "tracking.mlflow_uri"),
    "MLFLOW_TRACKING_URI": ({}, (), {"MLFLOW_TRACKING_URI": "http://mlflow:{pw}@127.0.0.1:1"}, "MLFLOW_TRACKING_URI"),
}


ENDPOINT_URLS = {  # case -> (spec patch, CLI args, what the error line names)
    "--base-url without a scheme": ({}, ("--base-url", "notaurl"), "--base-url: 'notaurl' is not an http:// or https://"),
    "--base-url without a host": ({}, ("--base-url", "http:///v1"), "--base-url: 'http:///v1' is not an http:// or https://"),
    "model.base_url without a scheme": ({"model": {"backend": "openai", "name": "scripted", "base_url": "localhost:8000/v1"}},
                                        (), "field 'model': model.base_url: 'localhost:8000/v1' is not an http:// or https://"),
}


@pytest.mark.parametrize("case", list(ENDPOINT_URLS))
def test_a_malformed_endpoint_url_is_refused_up_front(tmp_path, case):
    """Not taken to the first model call (questions and retrievals written, 7 attempts, then an error)."""
    patch, args, needle = ENDPOINT_URLS[case]
    make_data(tmp_path, 4)
    spec_path = write_spec(tmp_path, "http://127.0.0.1:9/v1")
    spec_path.write_text(yaml.safe_dump({**yaml.safe_load(spec_path.read_text()), **patch}))
    proc = cli(tmp_path, "run", str(spec_path), *args, "--limit", "2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert needle in line and ("rel.yaml" in line or not patch), line
    assert not (tmp_path / ".ragledger").exists()
    print(f"{case}: {line}")


def refused_with_credentials(ws: Path, case: str, password: str, env: dict | None = None) -> subprocess.CompletedProcess:
    patch, args, extra_env, _ = CREDENTIALS[case]
    spec_path = write_spec(ws, "http://127.0.0.1:9/v1", name="cred")
    spec = yaml.safe_load(spec_path.read_text())
    spec.update(json.loads(json.dumps(patch).replace("{pw}", password)))
    spec_path.write_text(yaml.safe_dump(spec))
    return cli(ws, "run", str(spec_path), *(a.replace("{pw}", password) for a in args),
               env={**(env or {}), **{k: v.replace("{pw}", password) for k, v in extra_env.items()}})


@pytest.mark.parametrize("case", list(CREDENTIALS))
def test_a_url_with_credentials_is_refused_up_front_without_showing_them(tmp_path, case):
    password = "pw-url-" + "".join(random.choices("abcdef0123456789", k=16))
    make_data(tmp_path, 4)
    proc = refused_with_credentials(tmp_path, case, password)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_error_line(proc)
    assert CREDENTIALS[case][3] in line and "carries credentials in the URL" in line, line
    assert password not in proc.stdout + proc.stderr
    assert not (tmp_path / ".ragledger").exists()
    print(f"{case}: {line}")


def test_secrets_appear_nowhere(tmp_path):
    """An API key (by env-var name), URL passwords (endpoint and MLflow URI: refused), a database password
    (PGPASSWORD / MLFLOW_TRACKING_PASSWORD) and service credentials (PREFECT_API_AUTH_STRING, AWS_SECRET_ACCESS_KEY;
    tests/test_auth.py runs them against servers that require them) go through a refused run, a completed run and a
    failed run; then every file those runs touched is searched: the store, the LLM-call cache, MLflow's database and
    artifacts, Prefect's database and results, the run logs, the indexes, and every line printed."""
    def secret(prefix: str) -> str:
        return prefix + "".join(random.choices("abcdef0123456789", k=24))

    api_key, url_password, db_password = secret("sk-ragledger-test-"), secret("pw-url-"), secret("pw-db-")
    service_secret = secret("pw-service-")  # the other services' credentials: Prefect's auth string, S3's secret key
    env = {"RAGLEDGER_TEST_API_KEY": api_key, "PGPASSWORD": db_password, "MLFLOW_TRACKING_PASSWORD": db_password,
           "PREFECT_API_AUTH_STRING": f"lab:{service_secret}", "AWS_SECRET_ACCESS_KEY": service_secret}
    make_data(tmp_path, 6)
    outputs: list[str] = []
    for case in CREDENTIALS:  # refused, each: nothing written, nothing shown
        proc = refused_with_credentials(tmp_path, case, url_password if "base" in case.lower() else db_password, env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        outputs += [proc.stdout, proc.stderr]
    with ScriptedServer(answer=lambda s, p, b: reader(s, p, b)) as server:
        spec = write_spec(tmp_path, server.base_url, api_key_env="RAGLEDGER_TEST_API_KEY")
        proc = cli(tmp_path, "run", str(spec), env=env, own_prefect=True)  # Prefect's database is searched too
        assert proc.returncode == 0, proc.stderr
        outputs += [proc.stdout, proc.stderr]
        assert server.requests  # the key went to the server (that is its purpose) ...
        port = server.port
    # ... and a failed run (an endpoint that is down) writes its traceback to a run log, with the key set (another
    # seed: calls are keyed by the model, not the URL, so the same calls would be answered from the call cache)
    failed = write_spec(tmp_path, "http://127.0.0.1:9/v1", name="rel-down", api_key_env="RAGLEDGER_TEST_API_KEY",
                        max_retries=0, timeout_s=2, seed=1)
    proc = cli(tmp_path, "run", str(failed), env=env, own_prefect=True)
    assert proc.returncode == 2, proc.stderr
    outputs += [proc.stdout, proc.stderr]

    files = [p for root in (tmp_path / ".ragledger", tmp_path / "indexes") for p in root.rglob("*") if p.is_file()]
    names = {p.relative_to(tmp_path).as_posix() for p in files}
    # the scan covers every kind of place a run writes (and would find a spec there: Prefect keeps the flow-run
    # parameters, which hold the endpoint URL)
    assert any(n.startswith(".ragledger/store/outcomes/") for n in names)
    assert ".ragledger/store/llm_cache.sqlite" in names and ".ragledger/mlflow.db" in names
    assert any(n.startswith(".ragledger/mlartifacts/") for n in names)
    assert any(n.startswith(".ragledger/prefect/prefect.db") for n in names)
    assert any(n.startswith(".ragledger/prefect/storage/") for n in names)
    assert any(n.startswith(".ragledger/logs/run-") for n in names)
    assert any(n.startswith("indexes/") for n in names)
    prefect_db = "".join(p.read_bytes().decode("latin-1") for p in files if "prefect.db" in p.name)
    assert f"127.0.0.1:{port}" in prefect_db
    haystack = [("output", o) for o in outputs]
    haystack += [(p.relative_to(tmp_path).as_posix(), p.read_bytes().decode("latin-1")) for p in files]
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / '.ragledger' / 'mlflow.db'}")
    for run in mlflow.search_runs(experiment_names=["rel"], output_format="list"):
        haystack += [("MLflow params", json.dumps(run.data.params)), ("MLflow tags", json.dumps(run.data.tags))]
    for name, value in (("API key", api_key), ("URL password", url_password), ("database password", db_password),
                        ("service credential", service_secret)):
        leaks = [where for where, text in haystack if value in text]
        assert not leaks, f"{name} leaked into {leaks}"
    print(f"scanned {len(files)} files, {len(outputs)} output streams and the MLflow params/tags: no secret found")
