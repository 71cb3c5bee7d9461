#!/usr/bin/env bash
# The GPU check: on one GPU, without vLLM (HF and rows backends), in under 8 minutes on an
# H200. Builds random-init Qwen2 models of Qwen2.5-0.5B's and 1.5B's shapes in bf16
# (scripts/standin_model.py); on the 1.5B times 2 full-rank and 2 low-rank (rows) ES
# iterations, 2 GRPO steps and a 50-problem compare, and on both measures ES throughput
# against plain batched generation (scripts/gpu_check.py: one JSON line on stdout), then runs
# the gpu-marked tests. --shape ci puts everything on the tiny shape.
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
        -h|--help) sed -n '2,9p' "$0"; echo "options: --device cuda|cpu --shape qwen2.5-1.5b|ci" \
                   "--dtype bfloat16|float32 --out DIR --skip-tests"; exit 0 ;;
        *) echo "gpu_check.sh: unknown option $1 (valid: --device --shape --dtype --out" \
                "--skip-tests --help)" >&2; exit 2 ;;
    esac
done
PY=${ES_LLM_PYTHON:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The throughput shapes: both Qwen2.5 shapes on the GPU, the stages' own shape otherwise.
THROUGHPUT=$SHAPE
[ "$SHAPE" = qwen2.5-1.5b ] && THROUGHPUT="qwen2.5-0.5b qwen2.5-1.5b"
MODELS=()
for shape in $THROUGHPUT; do
    "$PY" scripts/standin_model.py --arch qwen2 --shape "$shape" --dtype "$DTYPE" \
        --out "$OUT/models/$shape" >&2
    MODELS+=("$OUT/models/$shape")
done
"$PY" scripts/gpu_check.py --model "$OUT/models/$SHAPE" --device "$DEVICE" --dtype "$DTYPE" \
    --out "$OUT/runs" --throughput "${MODELS[@]}"
if [ "$TESTS" = 1 ]; then
    "$PY" -m pytest -m gpu -q >&2
fi
