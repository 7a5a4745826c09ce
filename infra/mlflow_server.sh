#!/usr/bin/env bash
# MLflow tracking server on PostgreSQL with proxied artifact storage, on 127.0.0.1 (ragledger/mlflow_server.py).
#   bash infra/mlflow_server.sh start|stop|status
# Environment (defaults in brackets); credentials only from here, never written anywhere:
#   RAGLEDGER_PG_HOST [127.0.0.1]  RAGLEDGER_PG_PORT [5432]  RAGLEDGER_PG_USER [postgres]
#   RAGLEDGER_PG_DB [ragledger_mlflow] (created if missing)  RAGLEDGER_PG_PASSWORD [none: trust auth]
#   RAGLEDGER_MLFLOW_PORT [5001]  RAGLEDGER_MLFLOW_SERVER_DIR [.ragledger/mlflow-server] (pid, log)
#   RAGLEDGER_MLFLOW_ARTIFACTS [<server dir>/artifacts] (where the server keeps uploaded artifacts: a folder, or
#     s3://BUCKET/PREFIX on any S3-compatible service, reached with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
#     AWS_SECRET_ACCESS_KEY in the server's environment only: clients upload through the server)
# Then: export MLFLOW_TRACKING_URI=http://127.0.0.1:5001 (or tracking.mlflow_uri in a spec) and ragledger run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "error: run bash infra/setup.sh first" >&2; exit 2; }
exec .venv/bin/python -m ragledger.mlflow_server "${1:-status}"
