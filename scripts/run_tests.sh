#!/usr/bin/env bash
# Set everything up and run the whole test suite except GPU tests (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${ES_LLM_VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
# The report test opens the HTML page in a real headless browser, so install one if missing.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=()
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium fonts-liberation
fi
# The slowest tests are listed at the end: what to look at first when the run grows.
exec "$VENV/bin/python" -m pytest -m "not gpu" --durations=25 "$@"
