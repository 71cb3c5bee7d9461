#!/usr/bin/env bash
# The GPU check: on one GPU, without vLLM (HF and rows backends), in under 8 minutes on an
# H200. Builds a random-init Qwen2 of Qwen2.5-1.5B's shape in bf16 (scripts/standin_model.py),
# times 2 full-rank and 2 low-rank (rows) ES iterations, 2 GRPO steps and a 50-problem
# compare on it (scripts/gpu_check.py: one JSON line on stdout with seconds and peak GPU
# memory per stage), then runs the gpu-marked tests.
#   bash scripts/gpu_check.sh                                  # on the GPU machine
#   bash scripts/gpu_check.sh --device cpu --shape ci --skip-tests   # the CPU rehearsal
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda SHAPE=qwen2.5-1.5b DTYPE=bfloat16 OUT="" TESTS=1
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --shape) SHAPE=$2; shift 2 ;;
        --dtype) DTYPE=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --skip-tests) TESTS=0; shift ;;
        -h|--help) sed -n '2,7p' "$0"; echo "options: --device cuda|cpu --shape qwen2.5-1.5b|ci" \
                   "--dtype bfloat16|float32 --out DIR --skip-tests"; exit 0 ;;
        *) echo "gpu_check.sh: unknown option $1 (valid: --device --shape --dtype --out" \
                "--skip-tests --help)" >&2; exit 2 ;;
    esac
done
PY=${ES_LLM_PYTHON:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" scripts/standin_model.py --arch qwen2 --shape "$SHAPE" --dtype "$DTYPE" \
    --out "$OUT/model" >&2
"$PY" scripts/gpu_check.py --model "$OUT/model" --device "$DEVICE" --dtype "$DTYPE" \
    --out "$OUT/runs"
if [ "$TESTS" = 1 ]; then
    "$PY" -m pytest -m gpu -q >&2
fi
