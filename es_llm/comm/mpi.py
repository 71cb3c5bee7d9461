"""mpi4py behind the communicator protocol (MPICH from the `mpich` wheel)."""

from __future__ import annotations

import os
import sys
from typing import Any


def launched_by_mpi() -> bool:
    """True under mpirun/mpiexec (MPICH's hydra or Open MPI), without importing mpi4py."""
    return any(k in os.environ for k in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                                         "MPI_LOCALRANKID"))


class MPIComm:
    def __init__(self):
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()

    def allgather(self, obj: Any) -> list[Any]:
        return self._comm.allgather(obj)

    def barrier(self) -> None:
        self._comm.Barrier()

    def abort(self, message: str, code: int = 1) -> None:
        print(f"[rank {self.rank}] {message}", file=sys.stderr, flush=True)
        self._comm.Abort(code)
