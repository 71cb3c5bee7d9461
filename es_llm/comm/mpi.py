"""mpi4py behind the communicator protocol (MPICH from the `mpich` wheel).

Collectives have a deadline. A rank that stops answering (stopped by a signal, deadlocked,
stuck in I/O) would otherwise leave every other rank spinning in ``MPI_Allgather`` forever;
a dead rank is no problem, the launcher ends the job. So the exchange is written with
point-to-point messages that are polled: rank 0 gathers every rank's object and sends the
list back. Rank 0 aborts the job when a rank has not sent its part within ``timeout_s``
seconds of rank 0 entering the exchange, naming that rank; the others wait twice as long
for rank 0's answer (so rank 0 names the culprit first) and then abort naming rank 0.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

# Message tags of the two halves of an exchange.
_GATHER, _SCATTER = 31, 32
# Seconds an aborting rank waits after printing its reason, so the launcher forwards it.
_FORWARD_S = 2.0


def launched_by_mpi() -> bool:
    """True under mpirun/mpiexec (MPICH's hydra or Open MPI) or srun, without importing
    mpi4py."""
    return any(k in os.environ for k in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                                         "MPI_LOCALRANKID"))


class MPIComm:
    """``allgather``, ``barrier`` and ``abort`` over MPI_COMM_WORLD, each exchange bounded
    by ``timeout_s`` (see the module docstring); ``local_rank`` / ``local_size`` are this
    rank's place among the ranks on its node."""

    def __init__(self, timeout_s: float = 300.0):
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.size = self._comm.Get_size()
        self.timeout_s = timeout_s
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        self._seq = 0
        self._where = ["host and pid not known yet"] * self.size
        self._where = self.allgather(f"{socket.gethostname()} pid {os.getpid()}")

    def allgather(self, obj: Any) -> list[Any]:
        self._seq += 1
        start = time.monotonic()
        if self.rank == 0:
            parts = [obj]
            for source in range(1, self.size):
                parts.append(self._receive(source, _GATHER, start + self.timeout_s))
            for dest in range(1, self.size):
                self._send((self._seq, parts), dest, _SCATTER, start + self.timeout_s)
            return parts
        self._send((self._seq, obj), 0, _GATHER, start + 2 * self.timeout_s)
        return self._receive(0, _SCATTER, start + 2 * self.timeout_s)

    def barrier(self) -> None:
        self.allgather(None)

    def abort(self, message: str, code: int = 1) -> None:
        print(f"[rank {self.rank}] {message}", file=sys.stderr, flush=True)
        # The launcher forwards a rank's stderr through a pipe and tears every rank down on
        # MPI_Abort; without a pause a loaded machine can lose the line that says why.
        time.sleep(_FORWARD_S)
        self._comm.Abort(code)

    def _silent(self, rank: int) -> None:
        self.abort(f"es-llm: rank {rank} ({self._where[rank]}) did not answer for "
                   f"{self.timeout_s:g} s in exchange {self._seq}: it is stopped, hung or far "
                   f"slower than the others. Ending the job; if ranks legitimately spend "
                   f"longer than that between exchanges, raise comm_timeout_s.")

    def _receive(self, source: int, tag: int, deadline: float) -> Any:
        """The payload of the next message from ``source`` with ``tag``."""
        pause = 1e-4
        while not self._comm.Iprobe(source=source, tag=tag):
            if time.monotonic() > deadline:
                self._silent(source)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        seq, payload = self._comm.recv(source=source, tag=tag)
        if seq != self._seq:
            self.abort(f"es-llm: rank {source} sent exchange {seq} while this rank is in "
                       f"exchange {self._seq}; the ranks are out of step.")
        return payload

    def _send(self, message, dest: int, tag: int, deadline: float) -> None:
        request = self._comm.isend(message, dest=dest, tag=tag)
        pause = 1e-4
        # A large message is only delivered once the receiver takes it.
        while not request.Test():
            if time.monotonic() > deadline:
                self._silent(dest)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
