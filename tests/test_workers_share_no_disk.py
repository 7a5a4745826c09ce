"""One experiment across machines that share no disk, on the real embedded model: `ragledger run --scheduler` into an
s3:// store on a Dask cluster of infra/dask_cluster.sh, whose two workers each have their own folder, HOME and copy of
the data (RAGLEDGER_DATA is relative: each process reads the `data` folder of its own working directory, as each host
reads its own disk). The run's process and the workers share only network endpoints: the S3 service (moto's server
mode, its own process), the Dask scheduler, the Prefect API and the embedded model's server, which the run's process
starts and the workers call. The run's outcomes are those of the same spec run on one machine into a local store
from the calls the workers put in the bucket (0 model calls there), and no record file lies outside the bucket and the
mirrors that name it."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from core.paths import cache_home
from tests.servers import S3Server, free_port
from tests.test_reliability import cli, make_data

REPO = Path(__file__).resolve().parent.parent
OUTCOMES = "SELECT cell, qid, prediction, em, f1, error_type FROM outcomes ORDER BY cell, qid"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def machine_home(folder: Path) -> Path:
    """A RAGLEDGER_HOME of its own that sees the embedded model already fetched on this machine (~400 MB from PyPI
    otherwise): the model's folder linked in, nothing else."""
    home = folder / "ragledger-home"
    home.mkdir(parents=True)
    (home / "models").symlink_to(cache_home() / "models", target_is_directory=True)
    return home


def write_spec(folder: Path) -> Path:
    spec = {
        "name": "nodisk",
        "dataset": {"name": "jsonl", "path": "questions.jsonl"},  # under RAGLEDGER_DATA: each machine's own copy
        "corpus": {"name": "jsonl", "paths": ["corpus.jsonl"]},
        "retrievers": ["bm25@2"],
        "readers": ["concatenation", "post_fusion"],
        "model": {"backend": "embedded", "max_tokens": 12, "concurrency": 2},
        "execution": {"shard_size": 2},
    }
    path = folder / "nodisk.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def outcomes(folder: Path, store: str, env: dict[str, str]) -> pd.DataFrame:
    proc = cli(folder, "query", OUTCOMES, "--store", store, "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_json(io.StringIO(proc.stdout))


def test_the_embedded_model_on_two_workers_that_share_no_disk_gives_one_machine_s_outcomes(tmp_path):
    from engines.embedded import llama_server_available
    from engines.models import BUNDLED_MODELS, DEFAULT_MODEL

    assert llama_server_available(), "llama-cpp-python[server] missing: run bash infra/setup.sh"
    assert BUNDLED_MODELS[DEFAULT_MODEL].installed(), "the embedded model is not fetched: run bash infra/demo.sh once"
    here, cluster = tmp_path / "orchestrator", tmp_path / "dask"
    (here / "data").mkdir(parents=True)
    make_data(here / "data", 4)
    for i in range(2):  # each worker's own copy of the data, in its own folder
        shutil.copytree(here / "data", cluster / f"worker-{i}" / "data")
    spec = str(write_spec(here))
    with S3Server() as s3:
        url = s3.url("nodisk")
        run_env = {**s3.env, "RAGLEDGER_HOME": str(machine_home(here)), "RAGLEDGER_DATA": "data"}
        script = ["bash", str(REPO / "infra" / "dask_cluster.sh")]
        cluster_env = {**os.environ, **run_env, "RAGLEDGER_DASK_DIR": str(cluster),
                       "RAGLEDGER_DASK_PORT": str(free_port())}
        started = subprocess.run([*script, "start"], cwd=tmp_path, env=cluster_env, capture_output=True, text=True,
                                 timeout=300)
        try:
            assert started.returncode == 0, started.stdout + started.stderr
            scheduler = started.stdout.split("--scheduler ")[1].split(")")[0]
            run = cli(here, "run", spec, "--store", url, "--scheduler", scheduler, "--json", str(here / "run.json"),
                      env=run_env)
            assert run.returncode == 0, run.stderr[-3000:]
        finally:
            subprocess.run([*script, "stop"], cwd=tmp_path, env=cluster_env, capture_output=True, timeout=120)
        summary = json.loads((here / "run.json").read_text())
        assert summary["task_processes"] == 2 and summary["llm_calls"] > 0, summary
        assert summary["questions"] == 4
        workers = [cluster / f"worker-{i}" / "home" / ".cache" / "ragledger" for i in range(2)]
        for home in workers:  # each worker ran stage tasks (14 in all) and wrote their records in a mirror of its own
            assert list(home.glob("stores/*/*/nodisk/seg-*")), f"{home}: no record segment"
        assert any(list(home.glob("stores/*/generations/nodisk/seg-*")) for home in workers)  # the model's answers
        assert any(list(home.glob("indexes/*")) for home in workers)  # an index built from the worker's own corpus copy
        # every record file on the three machines' disks lies in a mirror of the store (a folder naming its URL) and
        # is in the bucket under the same name: none was written beside it, in a working directory or a shared place
        in_bucket = set(s3.keys(url))
        record_files = [p for p in tmp_path.rglob("*.parquet") if p.name.startswith(("seg-", "pack-"))
                        and not {"projections", "mlartifacts"} & set(p.parts)]
        assert record_files
        for path in record_files:
            root = path.parents[2]
            assert json.loads((root / ".remote" / "origin.json").read_text())["url"] == url, path
            assert path.relative_to(root).as_posix() in in_bucket, path
        # one machine, a local store: the same spec from the calls the workers put in the bucket, as call packs
        local, packs = tmp_path / "local-store", tmp_path / "packs"
        packs.mkdir()
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        for key in [k for k in in_bucket if k.startswith("callpacks/")]:
            pack = packs / Path(key).name
            s3.client().download_file(bucket, f"{prefix}/{key}", str(pack))
            imported = cli(here, "cache", "import", str(pack), "--store", str(local), env=run_env)
            assert imported.returncode == 0, imported.stderr[-3000:]
        alone = cli(here, "run", spec, "--store", str(local), "--json", str(here / "local.json"), env=run_env)
        assert alone.returncode == 0, alone.stderr[-3000:]
        assert json.loads((here / "local.json").read_text())["llm_calls"] == 0
        remote = outcomes(here, url, {**s3.env, "RAGLEDGER_HOME": str(tmp_path / "reader-home")})
    pd.testing.assert_frame_equal(remote, outcomes(here, str(local), run_env))
    assert len(remote) == 2 * 4
