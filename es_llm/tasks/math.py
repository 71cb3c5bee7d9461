"""Math word problems with free-form answers, checked by math-verify in worker processes.

There is no generator: problems come from a local file. The gold answer is found from the
fields the file has (checked in this order, per record):

==============  =========================  ============================================
file            fields                     gold
==============  =========================  ============================================
olympiadbench   question, final_answer     first element of the list, ``$`` removed
gsm8k           question, answer           the number after the last ``####``, no commas
amc23           problem, answer (float)    ``27.0`` -> ``"27"``
math500, aime   problem, answer            the string as is
minerva_math    problem, solution          the content of the last ``\\boxed{...}``
==============  =========================  ============================================

The prompt is the file's ``prompt`` field if it has one, else the problem text followed by
one line asking for the final answer in ``\\boxed{}`` (which math-verify looks for first).
"""

from __future__ import annotations

import re
import weakref
from typing import Sequence

from es_llm.errors import BadInput
from es_llm.tasks.base import Problem, Score, TaskBase
from es_llm.tasks.loading import load_records, record_id, row_messages
from es_llm.tasks.math_worker import Checker, VerifierPool, check_answer, failure
from es_llm.tasks.registry import (TaskConfig, choose_rows, combine_reward, data_path,
                                   read_limit, register_task)

_BOXED_RE = re.compile(r"\\boxed\s*\{")
# A "$" that is not "\$" (an escaped dollar sign is part of the answer, e.g. \$18.90).
_MATH_DOLLAR_RE = re.compile(r"(?<!\\)\$")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start >= 0:
        i = start + len("\\boxed")
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1:j]
        # Unbalanced or brace-less: try the previous occurrence.
        start = text.rfind("\\boxed", 0, start)
    return None


def clean_gold(gold: str) -> str:
    """Remove math-mode ``$`` delimiters (not ``\\$``) and surrounding whitespace."""
    return _MATH_DOLLAR_RE.sub("", gold).strip()


def gold_from_record(rec: dict) -> str | None:
    """The gold answer of a record, by the first rule its fields allow (see module doc)."""
    final = rec.get("final_answer")
    if final is not None:
        if isinstance(final, (list, tuple)):
            final = final[0] if final else None
        return clean_gold(str(final)) if final is not None else None
    answer = rec.get("answer")
    if isinstance(answer, str):
        if "####" in answer:
            return answer.rsplit("####", 1)[1].strip().replace(",", "")
        return clean_gold(answer)
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return str(answer)
    if isinstance(answer, float):
        return str(int(answer)) if answer.is_integer() else repr(answer)
    solution = rec.get("solution")
    if isinstance(solution, str):
        boxed = last_boxed(solution)
        return clean_gold(boxed) if boxed is not None else None
    return None


def render_prompt(text: str,
                  instruction: str = "Put your final answer within \\boxed{}.") -> str:
    """The problem text, a blank line, then the instruction."""
    return f"{text.strip()}\n\n{instruction}"


def load_problems(path, limit: int | None = None) -> list[Problem]:
    """Math problems from a file; the gold answer is found per record (see module doc)."""
    records = load_records(path, {"text": ("problem", "question", "prompt")}, limit)
    problems = []
    for i, rec in enumerate(records):
        gold = gold_from_record(rec)
        if not gold:
            have = sorted(k for k, v in rec.items() if v is not None and k != "text")
            raise BadInput(f"data file {str(path)!r}: record {i} has no gold answer; math "
                           f"files need final_answer, answer (a string, a number or a GSM8K "
                           f"solution ending in '#### N'), or a solution with \\boxed{{...}}; "
                           f"the record has fields {', '.join(have)}.")
        prompt = rec.get("prompt") if isinstance(rec.get("prompt"), str) else None
        level = rec.get("level")
        problems.append(Problem(id=record_id(rec, i),
                                prompt=prompt or render_prompt(str(rec["text"])), gold=gold,
                                difficulty=level if isinstance(level, int) else 0,
                                messages=row_messages(rec, path, i)))
    return problems


class MathTask(TaskBase):
    """Math problems from a file, verified by math-verify in worker processes.

    ``score_many`` sends completions to the workers in chunks; each completion gets at most
    ``cfg.timeout_s`` seconds (the worker's own timer) and is cut off from the parent after
    ``timeout_s + grace_s``. Timeouts, crashes and checker exceptions give reward 0 and an
    error, never an exception. Workers start on first use and stop on ``close()`` (or on
    leaving a ``with`` block). ``checker`` replaces math-verify (tests use it to simulate
    slow verification); it must be a module-level function.
    """

    name = "math"

    def __init__(self, cfg: TaskConfig, *, workers: int = 1, chunk_size: int = 32,
                 grace_s: float = 1.0, checker: Checker | None = None):
        if cfg.data is None:
            raise BadInput("task 'math' has no problem generator: set task.data to a local "
                           ".jsonl/.json/.parquet file such as math500.jsonl, gsm8k.jsonl, "
                           "aime24.jsonl, amc23.jsonl, minerva_math.jsonl or "
                           "olympiadbench.jsonl.")
        self.cfg = cfg
        self._pool = VerifierPool(checker or check_answer, cfg.timeout_s, workers=workers,
                                  chunk_size=chunk_size, grace_s=grace_s,
                                  warmup=None if checker else ("1", "\\boxed{1}"))
        # Workers of a task dropped without close() stop when it is garbage-collected.
        weakref.finalize(self, self._pool.close)
        self._problems: list[Problem] | None = None

    def problems(self) -> list[Problem]:
        """The file's problems (loaded once, then reused)."""
        if self._problems is None:
            self._problems = choose_rows(
                load_problems(data_path(self.cfg), read_limit(self.cfg)), self.cfg)
        return list(self._problems)

    def score(self, problem: Problem, completion: str) -> Score:
        """Score one completion; never raises."""
        return self.score_many([(problem, completion)])[0]

    def score_many(self, pairs: Sequence[tuple[Problem, str]]) -> list[Score]:
        """Score many completions in the worker processes; never raises."""
        try:
            results = self._pool.run([(str(p.gold), c) for p, c in pairs])
        except Exception as exc:  # noqa: BLE001 - a pool bug must not stop a training run
            results = [failure(f"internal error: {exc!r}"[:300])] * len(pairs)
        return [self._to_score(r, c) for r, (_, c) in zip(results, pairs)]

    def _to_score(self, result: dict, completion: str) -> Score:
        format_ok = bool(_BOXED_RE.search(completion))
        correct = bool(result.get("correct"))
        # A check that failed (timeout, crash) earns nothing, not even the format share.
        reward = 0.0 if result.get("failed") else combine_reward(correct, format_ok,
                                                                 self.cfg.format_weight)
        return Score(reward=reward, correct=correct, answer=result.get("answer"),
                     format_ok=format_ok, answer_key=result.get("answer_key"),
                     solution_key=" ".join(completion.split()), error=result.get("error"))

    def close(self) -> None:
        """Stop the worker processes (they restart if the task is used again)."""
        self._pool.close()


@register_task("math")
def _build(cfg: TaskConfig) -> MathTask:
    return MathTask(cfg)
