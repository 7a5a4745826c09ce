#!/usr/bin/env bash
# README command 1: install everything (once) and run the embedded demo experiment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
.venv/bin/ragledger run configs/demo.yaml "$@"
