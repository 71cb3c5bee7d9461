"""The set-up gave a working environment: mpirun in the venv, evotorch, transformers models."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.mpi
def test_mpirun_from_the_venv_runs_two_ranks(tmp_path):
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        mpirun = Path(shutil.which("mpirun") or "mpirun")
    script = tmp_path / "allgather.py"
    # Rank 0 prints what both ranks received, so the two outputs cannot interleave.
    script.write_text("from mpi4py import MPI\n"
                      "c = MPI.COMM_WORLD\n"
                      "got = c.allgather(c.Get_rank() * 10)\n"
                      "seen = c.gather(got)\n"
                      "if c.Get_rank() == 0:\n"
                      "    print(seen)\n")
    proc = subprocess.run([str(mpirun), "-n", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[[0, 10], [0, 10]]"


def test_transformers_models_import_beside_the_cpu_torch():
    # Fails with "operator torchvision::nms does not exist" when a CUDA-built torchvision
    # sits beside the CPU torch; the set-up removes it.
    import transformers.models.llama.modeling_llama  # noqa: F401
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401


def test_evotorch_imports():
    # In a child process: evotorch pulls in numba/llvmlite, whose wrapper objects break the
    # kernel scan vLLM 0.32 runs when an engine starts, so it must not leak into this one.
    proc = subprocess.run([sys.executable, "-c", "import evotorch; print(evotorch.__version__)"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
