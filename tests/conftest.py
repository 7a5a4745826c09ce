from __future__ import annotations

import atexit
import functools
import os
import tempfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("RAGLEDGER_DATA", str((REPO / ".." / "shared" / "data").resolve()))
DATA = Path(os.environ["RAGLEDGER_DATA"])
# `ragledger run` records its run in Prefect and MLflow before it returns, as the tests that read them right after a
# command need; tests/test_direct_route.py runs it as a user does (recorded after the table, flows/direct.py)
os.environ["RAGLEDGER_FOREGROUND"] = "1"
# each command in its own process, none starting a warm runner for its directory as it ends (ragledger/warm_start.py):
# tests/test_warm_start.py and the benchmarks turn it back on
os.environ["RAGLEDGER_WARM"] = "0"


# The fast tier (bash infra/test.sh --fast: pytest -m "not integration and not slow", under 3 minutes on 2 cores)
# leaves these out; the full suite (.ci/run) runs them. Each took over ~4.5 s of its own (most 10-120 s, measured
# on 2 busy cores), or needs Chromium or a PostgreSQL server. A new test that slow gets @pytest.mark.slow or a line
# here. Entries: a file (every test in it) or file::test (every parametrization).
SLOW = {
    "tests/test_mlflow_pending.py",  # MLflow stopped and killed mid-logging, on PostgreSQL: 1-2 minutes per test
    "tests/test_mlflow_postgres.py",  # starts PostgreSQL and an MLflow server
    "tests/test_two_machines.py",  # two machines share one experiment through MLflow on PostgreSQL (~2 minutes)
    "tests/test_mlflow_pull.py",  # its shared store is a flow run logged to MLflow (~30 s), one test uses PostgreSQL
    "tests/test_mlflow_ui_browser.py",  # headless Chromium
    "tests/test_report_browser.py",  # headless Chromium
    "tests/test_flow_readers.py",  # every reader strategy through the flow
    "tests/test_flow_scripted.py",  # the flow end to end, with faults, and reruns
    "tests/test_dask_progress.py",  # a run on a local Dask cluster of two worker processes (~30 s)
    # a flow run through ragledger.run (~60-90 s on 2 busy cores), then docs/walkthrough.ipynb in a kernel (~20 s)
    "tests/test_notebook.py::test_run_returns_the_execution_its_readers_table_and_mlflow_run",
    "tests/test_notebook.py::test_the_walkthrough_notebook_runs_in_a_kernel",
    "tests/test_mlflow_log.py",  # four processes creating one SQLite store; a subprocess reading MLflow back
    "tests/test_disk_full.py::test_disk_full_stops_cleanly_and_resumes_to_the_same_outcomes",
    "tests/test_reliability.py::test_kill_9_at_five_points_then_resume_gives_the_uninterrupted_result",
    "tests/test_reliability.py::test_kill_9_of_a_run_that_records_after_its_table_then_resume_gives_the_uninterrupted_result",
    "tests/test_reliability.py::test_secrets_appear_nowhere",
    "tests/test_reliability.py::test_backend_down_is_a_clear_error_and_resumable",
    "tests/test_reliability.py::test_store_verify_names_a_damaged_segment",
    "tests/test_operations.py::test_dask_runner_gives_the_default_runners_outcomes",
    "tests/test_operations.py::test_a_long_lived_dask_cluster_sends_each_runs_task_events_to_that_runs_prefect_server",
    "tests/test_operations.py::test_a_scheduled_deployment_fires_and_its_mlflow_runs_appear",
    "tests/test_operations.py::test_a_killed_commands_temporary_prefect_server_dies_with_it",
    "tests/test_sweep.py::test_run_a_sweep_from_one_command",
    "tests/test_sweep.py::test_sweep_runs_each_dataset_as_an_experiment_with_one_endpoint",
    "tests/test_plan_pinning.py::test_outcomes_and_stage_keys_are_pinned",
    "tests/test_plan_cached.py::test_a_fully_cached_rerun_is_answered_from_the_store",
    "tests/test_plan_cached.py::test_ragledger_run_answers_a_cached_rerun_from_the_store_and_falls_back_to_the_flow",
    "tests/test_gold_passage_and_closed_book_filter.py::test_gold_passage_filter_and_readers_table",
    "tests/test_analysis_cli.py::test_analysis_writes_tables_plots_report_to_the_parent_run",
    "tests/test_analysis_cli.py::test_analyze_command_runs_the_flow_and_prints_tables",
    "tests/test_analysis_cli.py::test_analyze_prints_one_mrlr_table_per_reader",
    "tests/test_cold_start_imports.py::test_a_cached_rerun_starts_no_jvm_and_no_embedding_model",
    "tests/test_flow_llm_retrievers.py::test_compress_and_parametric_through_the_flow",
    "tests/test_eor.py::test_analyze_command_eor_pooling_option",
    "tests/test_eor.py::test_cosine_metric_uses_the_bundled_embedding_model",
    "tests/test_eor.py::test_analysis_flow_reports_eor_as_a_cell_on_held_out_questions",
    "tests/test_cli_index.py::test_index_command_builds_bm25_and_dense_once",
    "tests/test_java_start_cache.py::test_the_start_cache_is_made_with_the_index_and_a_jvm_started_from_it_finds_the_same_hits",
    "tests/test_retrievers.py::test_the_onnx_encoder_gives_sentence_transformers_vectors",
    "tests/test_retrievers.py::test_dense_retrieves_offline_and_caches_the_index",
    "tests/test_llm_client.py::test_calls_in_flight_when_the_model_call_process_dies_fail_by_name_and_the_next_call_starts_a_new_one",
}


# The tiers (bash infra/test.sh): --fast runs neither these nor SLOW; the default tier (.ci/run) checks every
# guarantee once, at the smallest size that can still fail, and leaves these out; --all runs them too. Each entry
# says what the default tier checks in its place. Same form as SLOW.
EXTENDED = {
    "tests/test_vllm_server.py",  # vLLM's CPU build (installed by --all): the openai dialects replayed in test_server_dialects
    # 20 experiments four at a time, and four at once on one store and MLflow: several runs on one store at once in
    # test_compaction.py (a reader during compaction) and test_store_remote.py (two machines' mirrors)
    "tests/test_soak.py",
    "tests/test_reliability.py::test_four_experiments_at_once_on_one_store_and_mlflow",
    # every reader strategy through the flow on scripted answers: each strategy's rules in test_readers_seeds.py and
    # REFEED's modules through the flow here, every reader through the flow on the real model in
    # test_real_model_strategies.py
    "tests/test_flow_readers.py::test_every_seed_strategy_through_the_flow",
    # `ragledger run` answering a rerun from the store, from the shell: test_launch.py answers one through the same
    # route, and test_plan_cached.py's other tests the store's answer itself
    "tests/test_plan_cached.py::test_ragledger_run_answers_a_cached_rerun_from_the_store_and_falls_back_to_the_flow",
    # MLflow on PostgreSQL read back by another process: test_mlflow_pull.py pulls a run logged to the same server
    "tests/test_mlflow_postgres.py",
    # every reading command on a bucket's store: a run into a bucket read by query on another machine, and the
    # Python API on it, stay in the default tier
    "tests/test_store_s3.py::test_reading_commands_on_an_s3_store",
    # compress and parametric through the flow on scripted answers: both run through the flow on the real model in
    # test_real_model_strategies.py
    "tests/test_flow_llm_retrievers.py::test_compress_and_parametric_through_the_flow",
    # a sweep's flow with one endpoint: `ragledger run` of a sweep from one command stays
    "tests/test_sweep.py::test_sweep_runs_each_dataset_as_an_experiment_with_one_endpoint",
    # a whole run on a full disk, resumed (~1 minute): a segment and the call cache on a full disk are the other
    # tests of test_disk_full.py; kill -9 and resume in test_reliability.py
    "tests/test_disk_full.py::test_disk_full_stops_cleanly_and_resumes_to_the_same_outcomes",
    "tests/test_mlflow_ui_browser.py",  # headless Chromium: MLflow runs read back in test_integration_embedded.py
    "tests/test_report_browser.py",  # headless Chromium: the report's tables in test_analysis_cli.py
    "tests/test_operations.py::test_dask_runner_gives_the_default_runners_outcomes",  # Dask: the thread runner
    # a Dask worker killed mid-run: kill -9 of the run's own process in test_reliability.py, Dask's workers in
    # test_dask_progress.py
    "tests/test_operations.py::test_a_dask_worker_killed_mid_run_leaves_the_same_outcomes",
    "tests/test_operations.py::test_a_long_lived_dask_cluster_sends_each_runs_task_events_to_that_runs_prefect_server",
    "tests/test_operations.py::test_a_scheduled_deployment_fires_and_its_mlflow_runs_appear",  # Prefect's scheduler
    # two machines through MLflow on PostgreSQL, analyse, trace, extend: the pull over PostgreSQL and a rerun from a
    # pulled store making no call are in test_mlflow_pull.py
    "tests/test_two_machines.py",
    # a second and third machine through an s3:// store, each with its own runs (~2-3 minutes): two mirrors sharing
    # calls and committing catalogs are in test_store_remote.py, a run into a bucket read elsewhere in test_store_s3.py
    "tests/test_store_s3.py::test_a_second_machine_reruns_and_extends_with_the_bucket_s_calls",
    "tests/test_store_s3.py::test_a_second_machine_compacts_and_the_first_reads_the_result",
    # two writers, a compactor and a reader on one bucket at once (~4 minutes): compare-and-swap and what a catalog made
    # unread are in test_store_remote.py
    "tests/test_store_s3_concurrent.py",
    # MLflow's artifacts in a bucket (a second MLflow server, ~2 minutes): proxied artifacts on a folder and a pull over
    # PostgreSQL are in test_mlflow_postgres.py and test_mlflow_pull.py
    "tests/test_mlflow_s3_artifacts.py",
    # read-only S3 credentials refused by each writing command (~1 minute): the write check on moto with IAM users is
    # in test_store_objects.py; a scheduled run into a bucket: test_store_s3.py's run into a bucket
    "tests/test_store_s3.py::test_read_only_credentials_read_and_a_command_that_writes_refuses_them",
    "tests/test_store_s3.py::test_a_scheduled_run_writes_into_the_bucket",
    # three servers with credentials, a TLS Dask cluster and four runs (~3 minutes): each server's refusal of a missing
    # credential and its start beyond loopback are the other tests of test_auth.py
    "tests/test_auth.py::test_authenticated_services_refuse_strangers_and_serve_a_run",
    # the embedded model at more sizes: every reader strategy on it (REFEED's log-probabilities included) and every
    # retriever that calls it stay in test_real_model_strategies.py
    "tests/test_integration_embedded.py::test_refeed_log_probabilities_come_from_the_real_embedded_model",
    "tests/test_real_model_prefix_reuse.py",
    "tests/test_real_model_sure_rounds.py",
    # MLflow down: stopped while logging, then logged once by the next run, stays in the default tier
    "tests/test_mlflow_pending.py::test_mlflow_stopped_before_the_run_then_sync_logs_it_exactly_once",
    "tests/test_mlflow_pending.py::test_a_kill_while_logging_is_completed_by_sync_and_sync_all_rebuilds_mlflow",
    # compaction before MLflow logged: sync and pull of a compacted store are in test_mlflow_pull.py and test_compaction.py
    "tests/test_compaction.py::test_an_experiment_compacted_before_mlflow_logged_it_is_synced_then_pulled_into_a_second_store",
    # a whole run on a Pyserini-built index: its passages read from the index in test_corpus_sources.py's other tests
    "tests/test_corpus_sources.py::test_a_run_on_a_pyserini_index_gives_the_outcomes_of_a_run_on_its_passage_file",
}


def _listed(nodeid: str, names: set[str]) -> bool:
    test = nodeid.split("[")[0]
    return test in names or test.split("::")[0] in names


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _listed(item.nodeid, SLOW):
            item.add_marker(pytest.mark.slow)
        if _listed(item.nodeid, EXTENDED):
            item.add_marker(pytest.mark.extended)


@pytest.fixture
def data_dir() -> Path:
    if not (DATA / "squad" / "dev-v1.1.json.gz").exists():
        pytest.fail(f"real data not found under {DATA} (set RAGLEDGER_DATA)")
    return DATA


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One temporary Prefect API (SQLite) for the whole pytest run, with task results persisted under tmp."""
    home = tmp_path_factory.mktemp("prefect")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(home / "storage")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(autouse=True)
def _no_leaked_mlflow_uri():
    """mlflow.set_tracking_uri (used by tests to read runs back) also sets MLFLOW_TRACKING_URI in os.environ;
    without this, a later test's CLI subprocesses would log to an earlier test's MLflow store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


EMBEDDED_MODEL = "qwen2.5-coder-0.5b-instruct-awq-q4km"


@pytest.fixture(scope="session")
def embedded_servers(tmp_path_factory) -> str:
    """One pair of embedded llama.cpp servers for the whole pytest run, plain and with log-probabilities, as the
    value of RAGLEDGER_EMBEDDED_SERVERS (engines/embedded.py `attached_endpoints`). The real-model tests that do
    not test the embedded backend's own start and stop use them (`shared_embedded`); each start loads the model and
    answers a first completion, and a stopped server's test would only repeat that."""
    from engines.embedded import attach_value, embedded_server, llama_server_available

    assert llama_server_available(), "llama-cpp-python[server] missing: run bash infra/setup.sh"
    logs = tmp_path_factory.mktemp("embedded-servers")
    quiet = lambda *args, **kwargs: None  # noqa: E731
    with (embedded_server(EMBEDDED_MODEL, log_dir=logs, log=quiet) as plain,
          embedded_server(EMBEDDED_MODEL, log_dir=logs, log=quiet, logits_all=True) as logprobs):
        yield attach_value(EMBEDDED_MODEL, 4096, plain, logprobs)


@pytest.fixture
def shared_embedded(embedded_servers, monkeypatch) -> str:
    """Runs of this test with `backend: embedded` (CLI subprocesses included) use the shared servers."""
    from engines.embedded import ATTACH_ENV

    monkeypatch.setenv(ATTACH_ENV, embedded_servers)
    return embedded_servers


PG_PASSWORD = "pg-Secret-" + uuid.uuid4().hex[:10]  # given to the server only through its environment


@pytest.fixture(scope="session")
def mlflow_postgres(tmp_path_factory):
    """One MLflow tracking server on PostgreSQL (infra/mlflow_server.sh, a fresh database) for the tests that do not
    stop it, each logging its own experiment; yields (url, the server's folder). tests/test_mlflow_pending.py starts
    its own, which it stops and starts."""
    from tests.servers import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), password=PG_PASSWORD)
    try:
        server.start()
    except Exception as exc:
        pytest.fail(str(exc))
    try:
        yield server.url, server.server_dir
    finally:
        server.drop()


@functools.cache
def shared_prefect_api() -> str:
    """One Prefect API server for the CLI runs of this pytest run (tests/test_reliability.py `cli`), started on first
    use and ended with pytest. A command without PREFECT_API_URL starts its own temporary server on a new SQLite
    database (ragledger/prefect_server.py), which costs ~10 s of a tiny run's ~22 s on 2 cores; the tests of that
    path start their own (`cli(..., own_prefect=True)`, tests/test_integration_embedded.py, tests/test_operations.py).
    Each command keeps its own PREFECT_HOME, so Prefect's persisted task results stay per workspace."""
    from ragledger.prefect_server import temporary_server

    home = Path(tempfile.mkdtemp(prefix="ragledger-test-prefect-"))
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PREFECT_")}
    os.environ["PREFECT_HOME"] = str(home)
    try:
        server = temporary_server()
        url = server.__enter__()
    finally:
        os.environ.pop("PREFECT_HOME")
        os.environ.update(saved)
    atexit.register(server.__exit__, None, None, None)
    return url
