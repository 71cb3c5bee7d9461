"""How ES ranks talk: a tiny communicator protocol with a serial and an MPI implementation.

Only small Python objects cross it (seeds, reward vectors, checksums); the maths never
imports MPI, it is handed a communicator.
"""

from __future__ import annotations

from typing import Any, Protocol


class Communicator(Protocol):
    rank: int
    size: int
    # This rank's index among the ranks on its node, and how many ranks the node runs.
    local_rank: int
    local_size: int

    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""

    def barrier(self) -> None:
        ...

    def abort(self, message: str, code: int = 1) -> None:
        """Stop every rank of the job."""


def make_communicator(timeout_s: float = 300.0) -> Communicator:
    """MPI when this process was started by mpirun with more than one rank, else serial.
    ``timeout_s``: how long an MPI exchange waits for a rank before ending the job."""
    from es_llm.comm.mpi import launched_by_mpi
    if launched_by_mpi():
        from es_llm.comm.mpi import MPIComm
        comm = MPIComm(timeout_s)
        if comm.size > 1:
            return comm
    from es_llm.comm.serial import SerialComm
    return SerialComm()
