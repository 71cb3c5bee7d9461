"""Arithmetic: evaluate a short expression of small non-negative integers with + - *.

A warm-up task for the character-level testbed: normal precedence, an integer answer that
may be negative. Generated problems come with a worked trace that does every ``*`` first,
then ``+`` and ``-`` left to right::

    prompt      "calc 3+4*5-2\\n"
    completion  "4*5=20 3+20=23 23-2=21 <answer>21</answer>"

Files are JSONL (or .json / .parquet) with ``id, prompt, answer`` (an integer) and an
optional ``difficulty``.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from es_llm.errors import BadInput
from es_llm.tasks.base import (MAX_COMPLETION_CHARS, InProcessTask, Problem, Score,
                               answer_blocks, too_long)
from es_llm.tasks.loading import load_records, record_id, row_messages
from es_llm.tasks.registry import (TaskConfig, check_tiers, choose_rows, combine_reward,
                                   data_path, distinct_problems, read_limit, register_task)

# An integer not glued to a digit before it, so the "-2" of "23-2" is read as "2".
_LAST_INT_RE = re.compile(r"(?<![0-9])-?[0-9]+")


def render_prompt(expression: str) -> str:
    """The compact testbed prompt, e.g. ``"calc 3+4*5-2\\n"``."""
    return f"calc {expression}\n"


def solve_with_trace(operands: Sequence[int], ops: Sequence[str]) -> tuple[int, list[str]]:
    """The value of ``operands[0] ops[0] operands[1] ...`` and its steps ``"a*b=c"``.

    Multiplications are done first, left to right, then additions and subtractions left to
    right, which is exactly normal precedence for + - *.
    """
    if len(ops) != len(operands) - 1 or any(op not in "+-*" for op in ops):
        raise ValueError(f"bad expression: operands {list(operands)}, operators {list(ops)}")
    values, pending, steps = list(operands), list(ops), []
    while "*" in pending:
        k = pending.index("*")
        a, b = values[k], values[k + 1]
        steps.append(f"{a}*{b}={a * b}")
        values[k:k + 2] = [a * b]
        del pending[k]
    value = values[0]
    for op, b in zip(pending, values[1:]):
        new = value + b if op == "+" else value - b
        steps.append(f"{value}{op}{b}={new}")
        value = new
    return value, steps


def generate(rng: random.Random, num_operands: int, *,
             max_operand: int = 9) -> tuple[Problem, str]:
    """A random expression of ``num_operands`` integers in ``[0, max_operand]`` and its trace.

    Operators are drawn uniformly from + - *. Returns the problem (gold = the integer value,
    difficulty = ``num_operands``) and the worked completion. Deterministic given ``rng``.
    """
    if num_operands < 2:
        raise ValueError(f"arithmetic needs at least 2 operands, got {num_operands}")
    operands = [rng.randint(0, max_operand) for _ in range(num_operands)]
    ops = [rng.choice("+-*") for _ in range(num_operands - 1)]
    expression = str(operands[0]) + "".join(f"{op}{n}" for op, n in zip(ops, operands[1:]))
    value, steps = solve_with_trace(operands, ops)
    problem = Problem(id=f"arithmetic-{expression}", prompt=render_prompt(expression),
                      gold=value, difficulty=num_operands)
    return problem, " ".join(steps) + f" <answer>{value}</answer>"


def extract_answer(completion: str, require_tag: bool = False) -> tuple[str | None, bool]:
    """The answer text and whether it came from ``<answer>`` tags.

    The last ``<answer>`` block wins; without one, the last integer in the completion
    (nothing with ``require_tag``).
    """
    blocks = answer_blocks(completion)
    if blocks:
        return blocks[-1].strip(), True
    if require_tag:
        return None, False
    found = _LAST_INT_RE.findall(completion)
    return (found[-1] if found else None), False


def score_completion(gold: int, completion: str, *, format_weight: float = 0.0,
                     max_digits: int = 32, require_answer_tag: bool = False,
                     max_completion_chars: int = MAX_COMPLETION_CHARS) -> Score:
    """Score an arithmetic completion: correct iff its answer is the integer ``gold``
    (``require_answer_tag``: only an answer inside ``<answer>`` tags counts)."""
    refused = too_long(completion, max_completion_chars)
    if refused is not None:
        return refused
    text, format_ok = extract_answer(completion, require_answer_tag)
    base = {"answer": text, "format_ok": format_ok,
            "solution_key": " ".join(completion.split())}
    if text is None:
        error = "no answer"
    elif not re.fullmatch(r"-?[0-9]+", text):
        error = "answer is not an integer"
    elif len(text.lstrip("-")) > max_digits:
        # int() of a huge digit string is slow (and refused past 4300 digits).
        error = f"answer too long ({len(text)} chars)"
    else:
        value = int(text)
        correct = value == gold
        return Score(reward=combine_reward(correct, format_ok, format_weight), correct=correct,
                     answer_key=str(value), **base)
    return Score(reward=combine_reward(False, format_ok, format_weight), correct=False,
                 error=error, **base)


def load_problems(path, limit: int | None = None) -> list[Problem]:
    """Arithmetic problems from a file with ``id, prompt, answer`` and optional ``difficulty``."""
    records = load_records(path, {"prompt": ("prompt",), "answer": ("answer",)}, limit)
    problems = []
    for i, rec in enumerate(records):
        answer = rec["answer"]
        if isinstance(answer, str) and re.fullmatch(r"\s*-?[0-9]{1,30}\s*", answer):
            answer = int(answer)
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)
        if not isinstance(answer, int) or isinstance(answer, bool):
            raise BadInput(f"data file {str(path)!r}: record {i} has answer {rec['answer']!r}; "
                           f"arithmetic answers must be integers.")
        meta = {"reference": rec["reference"]} if rec.get("reference") is not None else {}
        problems.append(Problem(id=record_id(rec, i), prompt=rec["prompt"], gold=answer,
                                difficulty=int(rec.get("difficulty") or 0), meta=meta,
                                messages=row_messages(rec, path, i)))
    return problems


class ArithmeticTask(InProcessTask):
    """Arithmetic problems (generated or from a file) with an exact integer check."""

    name = "arithmetic"

    def __init__(self, cfg: TaskConfig, *, max_operand: int = 9, max_answer_digits: int = 32):
        tiers = cfg.tiers or (2, 3, 4, 5)
        check_tiers("arithmetic", tiers, 2, 8)
        self.cfg, self._tiers = cfg, tiers
        self._max_operand, self._max_digits = max_operand, max_answer_digits
        self._problems: list[Problem] | None = None

    def problems(self) -> list[Problem]:
        """The task's problems (loaded or generated once, then reused)."""
        if self._problems is None:
            if self.cfg.data is not None:
                self._problems = choose_rows(
                    load_problems(data_path(self.cfg), read_limit(self.cfg)), self.cfg)
            else:
                made = distinct_problems(
                    lambda rng, tier: generate(rng, tier, max_operand=self._max_operand),
                    lambda p: p.prompt, self.cfg, self._tiers)
                self._problems = choose_rows(made, self.cfg)
        return list(self._problems)

    def _score(self, problem: Problem, completion: str) -> Score:
        return score_completion(int(problem.gold), completion,
                                format_weight=self.cfg.format_weight,
                                max_digits=self._max_digits,
                                require_answer_tag=self.cfg.require_answer_tag,
                                max_completion_chars=self.cfg.max_completion_chars)


@register_task("arithmetic", answer_tag=True)
def _build(cfg: TaskConfig) -> ArithmeticTask:
    return ArithmeticTask(cfg)
