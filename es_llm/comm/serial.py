"""The one-process communicator: the same interface, no transport."""

from __future__ import annotations

import sys
from typing import Any


class SerialComm:
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        pass

    def abort(self, message: str, code: int = 1) -> None:
        print(message, file=sys.stderr)
        raise SystemExit(code)
