"""A store at an s3:// URL (tracking/store/remote.py) end to end: `ragledger run` writes a spec's records into a bucket
on an S3-compatible server of its own process (moto's server mode, or the lab's service named by
RAGLEDGER_TEST_S3_URL) and its outcomes are those of the same spec run into a local folder; a second machine (another
RAGLEDGER_HOME, an empty mirror) reads them with `query`, `errors`, `history`, `store verify`, ...; the credentials
reach no file and no bucket object; bad S3 settings are one error line each, and write nothing."""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.servers import S3Server, free_port
from tests.test_reliability import cli, make_data, reader, write_spec

SECRET = "s3-secret-6f1c2a9e"  # the run's AWS_SECRET_ACCESS_KEY: found nowhere afterwards
OUTCOMES = "SELECT cell, qid, prediction, em, f1, error_type FROM outcomes ORDER BY cell, qid"


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


def machine(s3: S3Server, ws: Path, name: str) -> dict[str, str]:
    """The environment of a machine of its own: its own RAGLEDGER_HOME (so its own mirror of the store)."""
    env = {**s3.env, "RAGLEDGER_HOME": str(ws / name)}
    if not s3.lab:
        env["AWS_SECRET_ACCESS_KEY"] = SECRET
    return env


@pytest.fixture(scope="module")
def lab(tmp_path_factory, s3):
    ws = tmp_path_factory.mktemp("s3lab")
    make_data(ws, 8)
    url = s3.url("store")
    with ScriptedServer(answer=reader) as server:
        spec = write_spec(ws, server.base_url, name="exp")
        local = cli(ws, "run", str(spec), "--store", str(ws / "local"))
        assert local.returncode == 0, local.stderr[-3000:]
        remote = cli(ws, "run", str(spec), "--store", url, env=machine(s3, ws, "machine-a"))
        assert remote.returncode == 0, remote.stderr[-3000:]
    return ws, url


def frame(proc) -> pd.DataFrame:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_json(io.StringIO(proc.stdout)) if proc.stdout.strip() else pd.DataFrame()


def same_order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in one order without the write times (two runs' cells finish in their own order)."""
    df = df.drop(columns=[c for c in ("created_at",) if c in df.columns])
    return df.sort_values(list(df.columns), kind="stable").reset_index(drop=True) if len(df) else df


def test_a_run_into_a_bucket_gives_the_local_store_s_outcomes(lab, s3):
    ws, url = lab
    keys = s3.keys(url)
    # every record file, the catalog (the run compacted its experiment) and the run manifest are in the bucket
    assert any(k.startswith("outcomes/exp/pack-") and k.endswith(".parquet") for k in keys), keys
    assert any(k.startswith("generations/exp/") for k in keys) and "compacted/exp.json" in keys
    manifests = [k for k in keys if k.startswith("runs/exp/") and k.endswith(".json")]
    assert len(manifests) == 1
    # nothing machine-local went there: the call cache, projections, the mirror's bookkeeping
    assert not [k for k in keys if k.startswith(("llm_cache", "projections/", ".remote/", "mlflow-pending/"))]
    body = s3.client().get_object(Bucket=s3.bucket, Key=url.removeprefix(f"s3://{s3.bucket}/") + "/" + manifests[0])
    text = body["Body"].read().decode()
    # segment paths relative to the store, not to the writing machine's mirror
    assert str(ws / "machine-a") not in text and "s3-store:outcomes/exp/seg-" in text

    local = frame(cli(ws, "query", OUTCOMES, "--store", str(ws / "local"), "--format", "json"))
    # read on another machine: an empty mirror, filled from the bucket
    other = machine(s3, ws, "machine-b")
    remote = frame(cli(ws, "query", OUTCOMES, "--store", url, "--format", "json", env=other))
    assert len(local) == 16 and local["em"].sum() > 0
    pd.testing.assert_frame_equal(remote, local)


def test_reading_commands_on_an_s3_store(lab, s3):
    ws, url = lab
    other = machine(s3, ws, "machine-c")
    local_store = str(ws / "local")
    flips = ["flips", "concatenation", "post_fusion", "--experiment", "exp"]  # a header, then the table
    local, remote = cli(ws, *flips, "--store", local_store), cli(ws, *flips, "--store", url, env=other)
    assert remote.returncode == 0 and "8 shared questions" in remote.stdout and remote.stdout == local.stdout
    for args in (["errors", "exp"], ["history", "q1"], ["leaderboard"], ["hardest", "exp"]):
        local = cli(ws, *args, "--store", local_store, "--format", "json")
        remote = cli(ws, *args, "--store", url, "--format", "json", env=other)
        assert remote.returncode == 0, (args, remote.stderr[-2000:])
        pd.testing.assert_frame_equal(same_order(frame(remote)), same_order(frame(local)), obj=str(args))
    trace = ["trace", "exp", "q1"]  # the question's lineage through every cell
    local, remote = cli(ws, *trace, "--store", local_store), cli(ws, *trace, "--store", url, env=other)
    assert remote.returncode == 0 and "q1" in remote.stdout and remote.stdout == local.stdout, remote.stderr[-2000:]
    verify = cli(ws, "store", "verify", "--store", url, env=other)
    assert verify.returncode == 0 and "0 problem(s)" in verify.stdout, verify.stdout + verify.stderr


def test_no_credential_reaches_a_file_or_the_bucket(lab, s3):
    if s3.lab:
        pytest.skip("a lab's own secret is not known to the test")
    ws, url = lab
    leaks = [str(p) for p in ws.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []
    for key in s3.keys(url):
        data = s3.client().get_object(Bucket=s3.bucket, Key=url.removeprefix(f"s3://{s3.bucket}/") + "/" + key)
        assert SECRET.encode() not in data["Body"].read(), key


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and SECRET not in proc.stderr + proc.stdout
    return lines[0]


@pytest.mark.parametrize("command", ["query", "run"])
def test_bad_s3_settings_are_one_error_line_and_write_nothing(lab, s3, tmp_path, command):
    _, url = lab
    spec = write_spec(tmp_path, "http://127.0.0.1:9/v1", name="bad")
    make_data(tmp_path, 2)
    home = tmp_path / "home"

    def attempt(store: str, **env: str):
        args = ["run", str(spec)] if command == "run" else ["query", "SELECT 1"]
        started = time.monotonic()
        proc = cli(tmp_path, *args, "--store", store, env={**machine(s3, tmp_path, "home"), **env}, timeout=120)
        assert time.monotonic() - started < 90
        return _one_error_line(proc)

    assert attempt("s3://") == "error: --store s3://: no bucket (s3://BUCKET/PREFIX)"
    line = attempt("s3://no-such-bucket-here/x")
    assert line.startswith("error: --store s3://no-such-bucket-here/x: no bucket 'no-such-bucket-here'")
    dead = f"http://127.0.0.1:{free_port()}"
    assert attempt(url, AWS_ENDPOINT_URL=dead) == (f"error: --store {url}: cannot reach the S3 endpoint {dead} "
                                                   "(AWS_ENDPOINT_URL)")
    if command == "query":  # a prefix with nothing in it is not a store to read (a run makes one there)
        empty = s3.url("empty")
        assert attempt(empty) == f"error: --store {empty}: not a ragledger store: it holds no records or run manifests"
    # nothing written: no mirror, no .ragledger in the working directory
    assert not (home / "stores").exists() and not (tmp_path / ".ragledger").exists()
    assert not s3.keys(s3.url("empty").rsplit("-", 1)[0])


@pytest.mark.parametrize("command", ["query", "run"])
def test_wrong_s3_credentials_are_one_error_line_naming_the_service(tmp_path, command):
    """moto enforcing credentials from its first request (INITIAL_NO_AUTH_ACTION_COUNT=0): a command given a wrong
    secret key ends in one error line naming the S3 service and the variables, not the key, in bounded time, having
    written nothing."""
    if S3Server().lab:
        pytest.skip("a lab's service: its own credentials decide; wrong ones are shown refused on moto")
    spec = write_spec(tmp_path, "http://127.0.0.1:9/v1", name="bad")
    make_data(tmp_path, 2)
    with S3Server(no_auth_actions=0) as server:
        env = {**server.env, "RAGLEDGER_HOME": str(tmp_path / "home"), "AWS_SECRET_ACCESS_KEY": "wrong-secret-xyz"}
        args = ["run", str(spec)] if command == "run" else ["query", "SELECT 1"]
        started = time.monotonic()
        proc = cli(tmp_path, *args, "--store", "s3://ragledger-test/p", env=env, timeout=120)
        seconds = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: --store s3://ragledger-test/p: the S3 service at http://127.0.0.1:"), lines
    assert "refused the credentials" in lines[0] and "wrong-secret-xyz" not in proc.stdout + proc.stderr
    assert seconds < 90, seconds
    assert not (tmp_path / "home" / "stores").exists() and not (tmp_path / ".ragledger").exists()


def test_a_scheduled_run_writes_into_the_bucket(lab, s3, tmp_path):
    """What a `ragledger schedule` deployment runs (flows/experiment.py `scheduled_experiment`), given an s3:// store:
    the run goes through this machine's mirror into the bucket, and another machine reads its outcomes; `schedule`
    checks the URL before it serves (a bucket that is not there: one error line)."""
    import subprocess
    import sys

    from tests.test_reliability import prefect_env

    ws, url = lab
    local = frame(cli(ws, "query", OUTCOMES, "--store", str(ws / "local"), "--format", "json"))
    with ScriptedServer(answer=reader) as server:
        spec = yaml.safe_load(write_spec(ws, server.base_url, name="scheduled").read_text())
        code = ("import sys, json; from flows.experiment import scheduled_experiment; "
                "scheduled_experiment(json.loads(sys.argv[1]), sys.argv[2], 'sqlite:///' + sys.argv[3])")
        env = {**prefect_env(), **machine(s3, tmp_path, "scheduler"), "RAGLEDGER_INDEX_DIR": str(ws / "indexes")}
        done = subprocess.run([sys.executable, "-c", code, json.dumps(spec), url, str(tmp_path / "mlflow.db")],
                              cwd=ws, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    assert any(k.startswith("outcomes/scheduled/") for k in s3.keys(url))
    query = OUTCOMES.replace("FROM outcomes", "FROM outcomes WHERE experiment = 'scheduled'")
    remote = frame(cli(ws, "query", query, "--store", url, "--format", "json", env=machine(s3, tmp_path, "reader")))
    pd.testing.assert_frame_equal(remote, local)

    refused = cli(ws, "schedule", str(ws / "scheduled.yaml"), "--interval", "60", "--store",
                  "s3://no-such-bucket-here/p", env=machine(s3, tmp_path, "scheduler"))
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-2000:]
    assert lines[0].startswith("error: --store s3://no-such-bucket-here/p: no bucket 'no-such-bucket-here'"), lines


def test_read_only_credentials_read_and_a_command_that_writes_refuses_them(tmp_path):
    """moto enforcing IAM once the bucket and two users are made: a key whose policy allows reading only reads the
    store (`query`); `run`, `store compact`, `sync` and `analyze` with it end in one error line naming the store and
    the missing write permission, before anything is written (no object in the bucket, no mirror on the machine)."""
    if S3Server().lab:
        pytest.skip("a lab's service: its own policies decide; a read-only key is shown refused on moto")
    make_data(tmp_path, 4)
    with S3Server(no_auth_actions=7) as server:  # the bucket, then 3 requests per user, are made without credentials
        server.client().create_bucket(Bucket=server.bucket)
        users = server.iam_users({"writer": ["s3:*"], "reader": ["s3:GetObject", "s3:ListBucket"]})
        server.env = users["writer"]  # the test's own listing
        url = server.url("ro")
        with ScriptedServer(answer=reader) as model:
            made = cli(tmp_path, "run", str(write_spec(tmp_path, model.base_url, name="exp")), "--store", url,
                       env={**users["writer"], "RAGLEDGER_HOME": str(tmp_path / "writer")})
            assert made.returncode == 0, made.stderr[-3000:]
            held = server.keys(url)
            home = tmp_path / "reader"
            reading = {**users["reader"], "RAGLEDGER_HOME": str(home)}
            outcomes = frame(cli(tmp_path, "query", OUTCOMES, "--store", url, "--format", "json", env=reading))
            assert len(outcomes) == 8
            shutil.rmtree(home)
            spec = write_spec(tmp_path, model.base_url, name="other")
            calls = model.calls
            for args in (["run", str(spec)], ["store", "compact"], ["sync"], ["analyze", "exp", "--no-mlflow"]):
                proc = cli(tmp_path, *args, "--store", url, env=reading)
                lines = proc.stderr.strip().splitlines()
                assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr[-2000:])
                assert lines[0] == (f"error: --store {url}: the credentials in AWS_ACCESS_KEY_ID may read this store "
                                    "but not write to it (AccessDenied); this command writes"), (args, lines)
                assert server.keys(url) == held and not home.exists(), args
            assert model.calls == calls  # the refused run asked the model nothing


def test_a_second_machine_compacts_and_the_first_reads_the_result(lab, s3, tmp_path):
    """`store compact` on one machine commits the catalog by compare-and-swap and, once the retention time has passed,
    a later command deletes the replaced objects; a machine whose mirror still holds the old files reads the same
    outcomes from the new ones."""
    ws, url = lab
    with ScriptedServer(answer=reader) as server:  # a second experiment, left uncompacted
        spec = write_spec(ws, server.base_url, name="more", compact=False)
        done = cli(ws, "run", str(spec), "--store", url, env=machine(s3, ws, "machine-a"))
        assert done.returncode == 0, done.stderr[-3000:]
    before = [k for k in s3.keys(url) if k.startswith("outcomes/more/")]
    assert before and all(k.split("/")[-1].startswith("seg-") for k in before)
    first = frame(cli(ws, "query", OUTCOMES, "--store", url, "--format", "json", env=machine(s3, ws, "machine-a")))
    compacted = cli(ws, "store", "compact", "--store", url, env=machine(s3, ws, "machine-d"))
    assert compacted.returncode == 0, compacted.stderr[-3000:]
    kept = [k for k in s3.keys(url) if k.startswith("outcomes/more/")]  # replaced, kept for the retention time
    assert len(kept) == len(before) + 1, kept
    again = cli(ws, "store", "compact", "--store", url, env={**machine(s3, ws, "machine-d"),
                                                              "RAGLEDGER_STORE_RETENTION_S": "0"})
    assert again.returncode == 0, again.stderr[-3000:]
    after = [k for k in s3.keys(url) if k.startswith("outcomes/more/")]
    assert len(after) == 1 and after[0].split("/")[-1].startswith("pack-")
    assert "compacted/more.json" in s3.keys(url)
    again = frame(cli(ws, "query", OUTCOMES, "--store", url, "--format", "json", env=machine(s3, ws, "machine-a")))
    pd.testing.assert_frame_equal(again, first)


def test_the_mirror_holds_no_credential_and_names_the_url(lab, s3):
    ws, url = lab
    origins = list((ws / "machine-a" / "stores").glob(f"*/{'.remote'}/origin.json"))
    assert [json.loads(p.read_text()) for p in origins] == [{"url": url}]
    assert os.environ.get("AWS_SECRET_ACCESS_KEY", "\0") not in origins[0].read_text()


def test_the_python_api_reads_an_s3_store(lab, s3, monkeypatch):
    import ragledger

    ws, url = lab
    for name, value in machine(s3, ws, "machine-e").items():
        monkeypatch.setenv(name, value)
    remote = ragledger.open_store(url).outcomes("exp")
    local = ragledger.open_store(ws / "local").outcomes("exp")
    columns = ["cell", "qid", "prediction", "em", "f1", "error_type"]
    pd.testing.assert_frame_equal(remote[columns], local[columns])


CALLS = "SELECT count(DISTINCT call_id) AS n FROM generations"


def test_a_second_machine_reruns_and_extends_with_the_bucket_s_calls(lab, s3, tmp_path):
    """The LLM calls are shared through the bucket as call packs: a machine with an empty cache and an empty mirror,
    in another working directory, reruns the experiment through the flow (not answered from the store) and the model
    sees no request; extended to more questions, it asks the model only for the new questions' calls."""
    ws, url = lab
    packs = [k for k in s3.keys(url) if k.startswith("callpacks/")]
    assert packs and all(k.endswith(".jsonl.gz") for k in packs), packs
    made = int(frame(cli(ws, "query", CALLS, "--store", url, "--format", "json", env=machine(s3, ws, "machine-a")))
               ["n"][0])
    assert made > 0
    b = tmp_path / "b"
    b.mkdir()
    make_data(b, 8)
    env = {**machine(s3, b, "home"), "RAGLEDGER_CACHED_ANSWER": "0"}
    with ScriptedServer(answer=reader) as server:
        rerun = cli(b, "run", str(write_spec(b, server.base_url, name="exp")), "--store", url, env=env)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert server.calls == 0
    cache = next((b / "home" / "stores").glob("*/llm_cache.sqlite"))
    assert cache.is_file()
    # its calls were all in A's pack: it put none
    assert [k for k in s3.keys(url) if k.startswith("callpacks/")] == packs

    make_data(b, 12)  # the same 8 questions and 4 more
    with ScriptedServer(answer=reader) as server:
        more = cli(b, "run", str(write_spec(b, server.base_url, name="exp")), "--store", url, env=env)
        assert more.returncode == 0, more.stderr[-3000:]
        extended = int(frame(cli(b, "query", CALLS, "--store", url, "--format", "json", env=env))["n"][0])
        assert extended > made
        assert server.calls == extended - made
    # the new calls went to the bucket as one more pack, which a third machine imports
    after = [k for k in s3.keys(url) if k.startswith("callpacks/")]
    assert len(after) == len(packs) + 1
    with ScriptedServer(answer=reader) as server:
        third = cli(b, "run", str(write_spec(b, server.base_url, name="exp")), "--store", url,
                    env={**machine(s3, b, "home-c"), "RAGLEDGER_CACHED_ANSWER": "0"})
        assert third.returncode == 0, third.stderr[-3000:]
        assert server.calls == 0
