"""Quiet terminals: what the libraries say goes to the run folder's log file.

vLLM, transformers, torch (also from C++), MPI and Python warnings write to standard error.
Unless ``--verbose``, ``LibraryLog`` gives the libraries a file instead: file descriptor 2
(what C and C++ code write to, and Python's original ``sys.__stderr__``) points at the log,
Python logging (vLLM's loggers included) and warnings go there, and transformers' progress
bars are off; ``sys.stderr``, where es-llm's own messages and progress bars go, stays on the
terminal. Until the run folder exists the log is a temporary file; ``attach`` moves it to
``DIR/log.txt`` (``log.rank<R>.txt`` for MPI rank R > 0) and keeps appending there.
``finish`` puts everything back, so the command can also run inside another program.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from es_llm.errors import BadInput


def log_name(rank: int = 0) -> str:
    return "log.txt" if rank == 0 else f"log.rank{rank}.txt"


class LibraryLog:
    """Redirects library output between ``start`` and ``finish``; see the module docstring."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose
        self.path: Path | None = None
        self._attached = False
        self._saved: tuple | None = None

    def start(self) -> "LibraryLog":
        if self.verbose:
            return self
        # vLLM's loggers propagate to the root logger instead of printing themselves.
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        fd, name = tempfile.mkstemp(prefix="es-llm-log-", suffix=".txt")
        self.path = Path(name)
        sys.stderr.flush()
        original_fd = os.dup(2)
        terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
        os.dup2(fd, 2)
        os.close(fd)
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        # A vLLM imported earlier in this process has configured its own logger (printing to
        # standard output, not propagating): route it through the root logger meanwhile.
        engine = logging.getLogger("vllm")
        self._saved = (sys.stderr, original_fd, handler, root.level,
                       (engine.handlers[:], engine.propagate))
        engine.handlers, engine.propagate = [], True
        sys.stderr = terminal
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        _transformers_to_root(True)
        return self

    def attach(self, folder: str | Path, rank: int = 0) -> None:
        """Continue the log in ``folder`` (created by the caller), keeping what was written."""
        if self.path is None or self._attached:
            return
        target = Path(folder) / log_name(rank)
        sys.__stderr__.flush()
        try:
            with open(target, "ab") as out, open(self.path, "rb") as early:
                shutil.copyfileobj(early, out)
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            # The log stays in its temporary file, which finish() then names or removes.
            raise BadInput(f"could not write the log {str(target)!r} ({exc.strerror or exc}); "
                           f"give an --out folder this user can write.") from None
        os.dup2(fd, 2)
        os.close(fd)
        self.path.unlink(missing_ok=True)
        self.path, self._attached = target, True

    def finish(self, status: int) -> None:
        """Put standard error, logging and warnings back. A temporary log is removed, unless
        the command failed unexpectedly (status 1): then the terminal is told where it is."""
        if self._saved is None:
            return
        stderr, original_fd, handler, level, (engine_handlers, engine_propagates) = self._saved
        self._saved = None
        engine = logging.getLogger("vllm")
        engine.handlers, engine.propagate = engine_handlers, engine_propagates
        sys.__stderr__.flush()
        sys.stderr.flush()
        terminal, sys.stderr = sys.stderr, stderr
        terminal.close()
        os.dup2(original_fd, 2)
        os.close(original_fd)
        root = logging.getLogger()
        root.removeHandler(handler)
        root.setLevel(level)
        logging.captureWarnings(False)
        _transformers_to_root(False)
        if not self._attached:
            if status == 1 and self.path.stat().st_size:
                print(f"es-llm: the libraries' messages are in {self.path}", file=sys.stderr)
            else:
                self.path.unlink(missing_ok=True)


def _transformers_to_root(on: bool) -> None:
    """transformers' loggers into the root logger and its progress bars off (``on``), or
    back to its own handler and bars."""
    from transformers.utils import logging as hf_logging

    if on:
        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
        hf_logging.disable_progress_bar()
    else:
        hf_logging.enable_default_handler()
        hf_logging.disable_propagation()
        hf_logging.enable_progress_bar()
