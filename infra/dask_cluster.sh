#!/usr/bin/env bash
# A long-lived Dask scheduler and workers for `ragledger run --scheduler`, with mutual TLS (ragledger/dask_cluster.py).
#   bash infra/dask_cluster.sh certs            # a CA and a key/certificate per role; prints the client's variables
#   bash infra/dask_cluster.sh start|stop|status
# Environment (defaults in brackets):
#   RAGLEDGER_DASK_HOST [127.0.0.1]: beyond loopback the certificates are required (TLS, client certificates)
#   RAGLEDGER_DASK_PORT [8786]  RAGLEDGER_DASK_WORKERS [2]
#   RAGLEDGER_DASK_DIR [.ragledger/dask] (state, logs, one folder and HOME per worker)
#   RAGLEDGER_DASK_TLS_DIR [<dask dir>/tls] (ca.pem, scheduler/worker/client .pem and -key.pem)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "error: run bash infra/setup.sh first" >&2; exit 2; }
exec .venv/bin/python -m ragledger.dask_cluster "$@"
