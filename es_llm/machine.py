"""What a result was computed on: the CPU model, the torch build, the accelerator.

Builds and runs are bitwise reproducible on one machine type, not across them (float
reductions take other paths on other CPUs: two CPU types gave different bytes for the same
testbed build). Every run folder records this so a comparison can say when its inputs came
from different machines.
"""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else what
    ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model name", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict:
    """Plain data naming the machine: CPU model, torch build, the first CUDA device when
    there is one, Python, OS."""
    import torch

    info = {"cpu": cpu_model(), "torch": str(torch.__version__),
            "python": platform.python_version(),
            "system": f"{platform.system()} {platform.machine()}"}
    if torch.cuda.is_available():
        info["cuda"] = str(torch.version.cuda)
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def machine_kind(info: dict) -> str:
    """The part of ``machine_info`` that decides the bytes of a result: CPU, torch, GPU."""
    return " / ".join(str(info[k]) for k in ("cpu", "torch", "gpu") if info.get(k))

