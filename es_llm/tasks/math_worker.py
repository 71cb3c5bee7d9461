"""Verify free-form math answers in worker processes, under a hard wall-clock timeout.

math-verify bounds its own work with ``signal.alarm``, which only works on a process's main
thread, and sympy can hang (or grind in C, where no signal gets through) on inputs such as
``9^{9^{9^9}}``. So verification runs in spawned worker processes:

* in the worker, math-verify's alarms are off and one ``setitimer`` per item (on the
  worker's main thread) turns a slow item into ``error="timeout"`` without losing the worker;
* in the parent, ``VerifierPool`` waits at most ``timeout_s + grace_s`` for each item's
  result; past that it kills the worker, records ``"timeout"`` for the item, and continues
  the rest of the batch on a fresh worker. A crashed worker likewise costs only the item it
  was on.

Items travel in chunks (one pipe message per chunk, one small reply per item) so scoring
thousands of completions does not pay a process round trip per item.

``spawn`` re-imports the main module in the worker: scripts that score math answers need an
``if __name__ == "__main__":`` guard (vLLM's engine needs one too).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing as mp
import signal
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Callable, Sequence

# A checker maps (gold, completion) to a result dict; it must be a module-level function so
# that it can be pickled into a spawned worker.
Checker = Callable[[str, str], dict]


def failure(error: str) -> dict:
    """The result of an item that could not be checked (timeout, crash, exception)."""
    return {"correct": False, "answer": None, "answer_key": None, "error": error,
            "failed": True}


# ---------------------------------------------------------------------------------------------
# The default checker (runs inside a worker)
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _configs():
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    gold = [LatexExtractionConfig(), ExprExtractionConfig()]
    # math-verify's README settings for rewards, except malformed_operators=True: without it
    # \frac43 or \frac 59 (MATH-500 golds, and common model output) parse wrongly or not at all.
    pred = [LatexExtractionConfig(
        normalization_config=NormalizationConfig(basic_latex=True, units=True,
                                                 malformed_operators=True, nits=False,
                                                 boxed="all", equations=False),
        boxed_match_priority=0), ExprExtractionConfig()]
    return gold, pred


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str) -> list:
    """math-verify's parse of a gold answer: as LaTeX math (``$...$``), else as plain text."""
    from math_verify import parse

    gold_cfg, _ = _configs()
    parsed = parse(f"${gold}$", extraction_config=gold_cfg, parsing_timeout=None)
    return parsed or parse(gold, extraction_config=gold_cfg, parsing_timeout=None)


def check_answer(gold: str, completion: str) -> dict:
    """Check ``completion`` against ``gold`` with math-verify (gold first: it is asymmetric).

    Returns ``correct``, ``answer`` (the extracted prediction text), ``answer_key`` (the
    parsed prediction as a string) and ``error`` (None, "no answer" or "gold unparseable").
    Timeouts are the caller's job; see ``VerifierPool``.
    """
    from math_verify import parse, verify

    _, pred_cfg = _configs()
    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return {"correct": False, "answer": None, "answer_key": None,
                "error": "gold unparseable"}
    pred = parse(completion, extraction_config=pred_cfg, parsing_timeout=None)
    if not pred:
        return {"correct": False, "answer": None, "answer_key": None, "error": "no answer"}
    answer = str(pred[1]) if len(pred) > 1 else str(pred[0])
    correct = bool(verify(gold_parsed, pred, timeout_seconds=None))
    return {"correct": correct, "answer": answer, "answer_key": str(pred[0]), "error": None}


# ---------------------------------------------------------------------------------------------
# The worker process
# ---------------------------------------------------------------------------------------------

class _ItemTimeout(BaseException):
    """Raised by the worker's timer; a BaseException so library ``except Exception`` misses it."""


def _on_alarm(signum, frame):
    raise _ItemTimeout()


def _run_item(checker: Checker, gold: str, completion: str, timeout_s: float) -> dict:
    result = None
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            result = checker(gold, completion)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _ItemTimeout:
        # The timer may fire just after the checker returned; keep a finished result.
        if result is None:
            return failure("timeout")
    except Exception as exc:  # noqa: BLE001 - any checker failure is this item's error
        return failure(f"{type(exc).__name__}: {exc}"[:300])
    if not isinstance(result, dict):
        return failure(f"checker returned {type(result).__name__}, not a dict")
    return result


def worker_main(conn: Connection, checker: Checker, timeout_s: float,
                warmup: tuple[str, str] | None) -> None:
    """Serve chunks ``[(index, gold, completion), ...]`` until ``None`` or a closed pipe.

    Sends ``("ready", None)`` once warmed up, then ``(index, result)`` after each item.
    """
    # Timeouts are disabled on purpose; the once-per-process warning about it is noise here.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    signal.signal(signal.SIGALRM, _on_alarm)
    if warmup is not None:
        # Pays the imports and ANTLR start-up before the first timed item; untimed, so a
        # short timeout_s cannot interrupt a library halfway through initialising (the
        # parent's start-up timeout still bounds it).
        try:
            checker(*warmup)
        except Exception:  # noqa: BLE001 - a failing warm-up shows up again on real items
            pass
    conn.send(("ready", None))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for index, gold, completion in chunk:
            conn.send((index, _run_item(checker, gold, completion, timeout_s)))


# ---------------------------------------------------------------------------------------------
# The parent side
# ---------------------------------------------------------------------------------------------

@dataclass
class _Job:
    """A chunk on a worker: item indices, how many are done, when the next result is due."""

    indices: list[int]
    pos: int
    deadline: float


class _Worker:
    """One worker process and its pipe; started lazily, killed on timeout or crash."""

    def __init__(self):
        self.proc = None
        self.conn: Connection | None = None
        self.ready = False

    def start(self, ctx, args: tuple) -> None:
        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=worker_main, args=(child, *args), daemon=True,
                                name="es-llm-math-verifier")
        self.proc.start()
        child.close()
        self.conn, self.ready = parent, False

    def kill(self) -> None:
        """Kill the process (if any) and close the pipe."""
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn, self.ready = None, None, False

    def stop(self) -> None:
        """Ask the worker to exit, then make sure it has."""
        if self.conn is not None and self.proc is not None:
            try:
                self.conn.send(None)
                self.proc.join(2)
            except (OSError, ValueError):
                pass
        self.kill()


class VerifierPool:
    """Worker processes running ``checker(gold, completion)`` with a hard per-item timeout.

    ``run`` never raises for a bad item: a timeout gives ``error="timeout"``, a crash or an
    exception gives its description, each with ``failed=True``. Not thread-safe: use one
    pool per thread.
    """

    def __init__(self, checker: Checker, timeout_s: float, *, workers: int = 1,
                 chunk_size: int = 32, warmup: tuple[str, str] | None = None,
                 startup_timeout_s: float = 120.0, grace_s: float = 1.0,
                 start_method: str = "spawn"):
        if workers < 1 or chunk_size < 1:
            raise ValueError(f"workers and chunk_size must be >= 1, got {workers}, {chunk_size}")
        self._args = (checker, timeout_s, warmup)
        self._ctx = mp.get_context(start_method)
        self._workers = [_Worker() for _ in range(workers)]
        self._chunk_size = chunk_size
        self._item_wait = timeout_s + grace_s
        self._startup_wait = startup_timeout_s

    def run(self, items: Sequence[tuple[str, str]]) -> list[dict]:
        """Results for ``items`` (pairs of gold and completion), in order."""
        results: list[dict | None] = [None] * len(items)
        queue = deque(list(range(i, min(i + self._chunk_size, len(items))))
                      for i in range(0, len(items), self._chunk_size))
        busy: dict[_Worker, _Job] = {}
        while queue or busy:
            for worker in self._workers:
                if queue and worker not in busy:
                    job = self._dispatch(worker, queue.popleft(), items, results, queue)
                    if job is not None:
                        busy[worker] = job
            if not busy:
                continue
            by_conn = {w.conn: w for w in busy}
            timeout = max(0.0, min(j.deadline for j in busy.values()) - time.monotonic())
            for conn in wait(list(by_conn), timeout):
                worker = by_conn[conn]
                if not self._receive(worker, busy[worker], results, queue):
                    del busy[worker]
            now = time.monotonic()
            for worker, job in list(busy.items()):
                if job.deadline <= now:
                    self._fail(worker, job, results, queue,
                               "timeout" if worker.ready else "worker did not start in time")
                    del busy[worker]
        return [r if r is not None else failure("lost result") for r in results]

    def _dispatch(self, worker: _Worker, indices: list[int], items, results,
                  queue) -> _Job | None:
        """Send a chunk to ``worker`` (starting it if needed); None if that failed."""
        if worker.proc is None or not worker.proc.is_alive():
            # Never started, or died while idle (killed from outside): start a fresh one
            # rather than blame the first item of this chunk for its death.
            worker.kill()
            worker.start(self._ctx, self._args)
        job = _Job(indices, 0, time.monotonic() + (self._item_wait if worker.ready
                                                   else self._startup_wait))
        try:
            worker.conn.send([(i, items[i][0], items[i][1]) for i in indices])
        except (OSError, ValueError) as exc:
            self._fail(worker, job, results, queue, f"worker unreachable: {exc}")
            return None
        return job

    def _receive(self, worker: _Worker, job: _Job, results, queue) -> bool:
        """Handle one message; False when the job is over (finished or failed)."""
        try:
            head, payload = worker.conn.recv()
        except (EOFError, OSError):
            code = None
            if worker.proc is not None:
                worker.proc.join(1)  # the pipe closes just before the exit status is ready
                code = worker.proc.exitcode
            self._fail(worker, job, results, queue, f"worker crashed (exit code {code})")
            return False
        job.deadline = time.monotonic() + self._item_wait
        if head == "ready":
            worker.ready = True
            return True
        results[head] = payload
        job.pos += 1
        return job.pos < len(job.indices)

    def _fail(self, worker: _Worker, job: _Job, results, queue, error: str) -> None:
        """Record ``error`` for the item in progress, kill the worker, requeue the rest."""
        started = worker.ready
        worker.kill()
        if not started:
            # A worker that dies before it is ready would die again: fail the chunk, don't loop.
            for i in job.indices[job.pos:]:
                results[i] = failure(f"worker failed to start: {error}")
            return
        results[job.indices[job.pos]] = failure(error)
        rest = job.indices[job.pos + 1:]
        if rest:
            queue.appendleft(rest)

    def close(self) -> None:
        """Stop every worker process."""
        for worker in self._workers:
            worker.stop()
