#!/usr/bin/env bash
# Set everything up and run the main job on the embedded testbed: build the default base
# model and evaluate it on its held-out Countdown set (64 samples per problem, T = 1.0).
# The distillation teachers are left out here (about 20 more minutes); running
# `es-llm testbed --size default --out runs/main/testbed` adds them to the cached student.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${ES_LLM_VENV:-.venv}
OUT=${1:-runs/main}
"$VENV/bin/es-llm" testbed --size default --out "$OUT/testbed" teachers.enabled=false
"$VENV/bin/es-llm" eval --model "$OUT/testbed" --task countdown --n 64 --temperature 1.0 \
    --out "$OUT/eval-base"
