"""Where a rank runs on its node: its own CPU cores and, with ``device=cuda``, its own GPU,
both chosen from the rank's place among the ranks on the node (``local_rank`` of
``local_size``).

Without this, every rank's threads (torch's and vLLM's OpenMP kernels) may run on every core:
on 2 cores, a second engine beside a GRPO run took its step from about 5 s to 38 s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence


def cores_for_rank(local_rank: int, local_size: int, cpus: Sequence[int]) -> list[int]:
    """Rank ``local_rank``'s share of ``cpus``: the sorted CPUs split into ``local_size``
    contiguous runs as even as possible (the first ``len(cpus) % local_size`` runs one
    longer). With more ranks than CPUs, ranks share CPUs round-robin, one each."""
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} is not in [0, {local_size})")
    ordered = sorted(cpus)
    if not ordered:
        raise ValueError("no CPUs to share")
    if local_size > len(ordered):
        return [ordered[local_rank % len(ordered)]]
    base, extra = divmod(len(ordered), local_size)
    start = local_rank * base + min(local_rank, extra)
    return ordered[start:start + base + (local_rank < extra)]


def gpu_for_rank(local_rank: int, visible: Sequence[str]) -> str:
    """The GPU (an entry of ``CUDA_VISIBLE_DEVICES``) of rank ``local_rank``: one rank per
    GPU, ranks beyond the GPU count sharing them round-robin."""
    if not visible:
        raise ValueError("no GPUs to choose from")
    return visible[local_rank % len(visible)]


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries, read without
    initialising CUDA (after which the variable would no longer take effect)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()]
    gpus = Path("/proc/driver/nvidia/gpus")
    count = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    return [str(i) for i in range(count)]


def cpu_list(cores: Sequence[int]) -> str:
    """``cores`` in the comma-separated form of ``VLLM_CPU_OMP_THREADS_BIND``."""
    return ",".join(str(c) for c in cores)


def place_rank(local_rank: int, local_size: int, device: str, bind_cores: bool) -> list[int]:
    """Pin this process to its cores (threads started later inherit them; torch's thread
    pool is resized to match) and, with ``device=cuda`` and several ranks on the node, show
    it only its own GPU. Call before any model, engine or CUDA context exists. Returns the
    cores the process may use."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    if bind_cores:
        cores = cores_for_rank(local_rank, local_size, cores)
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))
    else:
        # Unpinned ranks still divide the node's cores between their thread pools.
        torch.set_num_threads(max(1, len(cores) // local_size))
    # vLLM binds the OpenMP threads of an engine it starts in worker processes to the node's
    # cores unless told otherwise; keep them on this rank's own.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_list(cores))
    if device == "cuda" and local_size > 1:
        visible = visible_gpus()
        if visible:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_for_rank(local_rank, visible)
    return cores
