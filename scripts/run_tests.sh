#!/usr/bin/env bash
# Set everything up and run the whole test suite except GPU tests (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${ES_LLM_VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
exec "$VENV/bin/python" -m pytest -m "not gpu" "$@"
