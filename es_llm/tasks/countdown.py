"""Countdown: combine the given numbers with + - * / (each exactly once) to reach a target.

Scoring is security-critical because the answer is model-written text that looks like
Python. TinyZero and the ES-at-scale code ``eval`` it after a character whitelist that still
admits ``**`` (``44**19**35`` hangs the process). Here nothing from the model is ever
evaluated by Python: the answer is parsed with ``ast.parse`` under a length cap, only
``+ - * /`` over plain decimal integer literals is accepted, the literals must be exactly the
given numbers, and the value is computed with exact ``fractions.Fraction`` arithmetic. The
work is therefore bounded by the number of given numbers, so no timeout is needed; a
completion longer than ``task.max_completion_chars`` scores 0 before any parsing, and the answer
tags are found in one linear scan.

By default an answer outside ``<answer>`` tags (the last line, or the text after an unclosed
tag) still counts as correct, with ``format_ok`` false. ``require_answer_tag`` counts only the
last closed block with the ES paper's character rule (digits, ``+ - * / ( )`` and spaces), so
the verdict is the paper's answer reward (``countdown/countdown_task.py`` of Qiu et al.
2025) except that ``**``, ``//`` and unary signs, which that code hands to ``eval``, score 0.

Problems come from a file (the ES-paper ``countdown.json``, or the project's JSONL with
``id, prompt, numbers, target, difficulty``) or from ``generate``, which also writes a worked
solution trace in the compact testbed format::

    prompt      "nums 7 3 4 make 25\\n"
    completion  "7*3=21 21+4=25 <answer>7*3+4</answer>"
"""

from __future__ import annotations

import ast
import math
import random
import re
from fractions import Fraction
from typing import Sequence, Union

from es_llm.errors import BadInput
from es_llm.tasks.base import (MAX_COMPLETION_CHARS, InProcessTask, Problem, Score,
                               answer_blocks, too_long)
from es_llm.tasks.loading import load_records, record_id, row_messages
from es_llm.tasks.registry import (TaskConfig, check_tiers, choose_rows, combine_reward,
                                   data_path, distinct_problems, read_limit, register_task)

# An expression tree: a leaf number, or (operator, left, right) with operator in "+-*/".
Tree = Union[int, tuple]

_BAD_CHAR_RE = re.compile(r"[^0-9+\-*/()\s]")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
# The ES paper's whitelist for a tagged answer: ``re.match(r"^[0-9+\-*/() ]+$", block)``,
# whose ``$`` also matches before one final newline.
_PAPER_CHARS_RE = re.compile(r"[0-9+\-*/() ]+\n?")
# The largest given number the verifier can match: answers are plain decimal literals of at
# most this many digits (negative numbers cannot be written without a unary sign).
MAX_NUMBER_DIGITS = 6


class _Rejected(Exception):
    """An answer that is not a valid Countdown expression; the message is the Score error."""


# ---------------------------------------------------------------------------------------------
# Expression trees: evaluation, rendering, canonical keys
# ---------------------------------------------------------------------------------------------

def _prec(op: str) -> int:
    return 1 if op in "+-" else 2


def evaluate(tree: Tree) -> Fraction:
    """The exact value of ``tree``; raises ZeroDivisionError on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


def render(tree: Tree) -> str:
    """``tree`` as an infix string with parentheses only where precedence requires them."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    ls, rs = render(left), render(right)
    if not isinstance(left, int) and _prec(left[0]) < _prec(op):
        ls = f"({ls})"
    # - and / are not associative: a-(b-c) and a/(b/c) keep their parentheses.
    if not isinstance(right, int) and (_prec(right[0]) < _prec(op)
                                       or (_prec(right[0]) == _prec(op) and op in "-/")):
        rs = f"({rs})"
    return f"{ls}{op}{rs}"


def solution_key(tree: Tree) -> str:
    """A canonical form of ``tree``: one string for all rearrangements of the same solution.

    Chains of + and - become a sorted multiset of added and subtracted terms, chains of * and
    / a sorted multiset of multiplied and divided factors, so ``3+4`` and ``4+3`` (and
    ``a-(b-c)`` and ``a+c-b``) share a key while a different grouping of operations does not.
    """
    if isinstance(tree, int):
        return str(tree)
    additive = tree[0] in "+-"
    plus, minus = ("+", "-") if additive else ("*", "/")
    pos: list[str] = []
    neg: list[str] = []
    _collect(tree, plus, minus, pos, neg, flipped=False)
    return plus.join(sorted(pos)) + "".join(minus + k for k in sorted(neg))


def _collect(tree: Tree, plus: str, minus: str, pos: list, neg: list, flipped: bool) -> None:
    if not isinstance(tree, int) and tree[0] in (plus, minus):
        op, left, right = tree
        _collect(left, plus, minus, pos, neg, flipped)
        _collect(right, plus, minus, pos, neg, flipped != (op == minus))
        return
    key = solution_key(tree)
    # A sum inside a product needs parentheses to keep the key unambiguous.
    if plus == "*" and not isinstance(tree, int):
        key = f"({key})"
    (neg if flipped else pos).append(key)


def leaves(tree: Tree) -> list[int]:
    """The numbers of ``tree``, left to right."""
    if isinstance(tree, int):
        return [tree]
    return leaves(tree[1]) + leaves(tree[2])


# ---------------------------------------------------------------------------------------------
# Parsing model answers (never evaluated by Python)
# ---------------------------------------------------------------------------------------------

def extract_answer(completion: str, require_tag: bool = False) -> tuple[str | None, bool]:
    """The answer text of a completion and whether it sat in ``<answer>`` tags.

    The last ``<answer>...</answer>`` block wins. Without one, the last non-empty line is the
    answer (format_ok False); if that line holds an unclosed ``<answer>`` (a truncated
    completion), the text after it is used. With ``require_tag`` there is no fallback: no
    closed block means no answer.
    """
    blocks = answer_blocks(completion)
    if blocks:
        return blocks[-1].strip(), True
    if require_tag:
        return None, False
    lines = [ln.strip() for ln in completion.splitlines() if ln.strip()]
    if not lines:
        return None, False
    line = lines[-1]
    if "<answer>" in line:
        line = line.rsplit("<answer>", 1)[1].strip()
    return (line or None), False


def parse_expression(text: str, *, max_chars: int = 256,
                     max_literal_digits: int = MAX_NUMBER_DIGITS) -> Tree:
    """Parse ``text`` into a Tree, accepting only ``+ - * /`` over decimal int literals.

    Raises ``_Rejected`` with a short reason for anything else (including ``**``, ``//``,
    ``%``, unary signs, names, calls, floats, booleans, over-long input or literals, and any
    character other than digits, ``+-*/``, parentheses and whitespace).
    ``ast.parse`` only builds a syntax tree; nothing is compiled or executed.
    """
    if len(text) > max_chars:
        raise _Rejected(f"answer too long ({len(text)} chars > {max_chars})")
    # Nothing but digits, operators, parentheses and spaces can form a valid answer; checking
    # the characters first keeps identifiers, strings and escapes away from the parser.
    bad = sorted(set(_BAD_CHAR_RE.findall(text)))
    if bad:
        raise _Rejected(f"disallowed characters: {''.join(bad)!r}")
    try:
        node = ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        raise _Rejected(f"unparseable: {type(exc).__name__}") from None
    return _to_tree(node.body, text, max_literal_digits)


def _to_tree(node: ast.AST, source: str, max_digits: int) -> Tree:
    if isinstance(node, ast.BinOp):
        op = _OPS.get(type(node.op))
        if op is None:
            raise _Rejected(f"disallowed syntax: {type(node.op).__name__}")
        return (op, _to_tree(node.left, source, max_digits),
                _to_tree(node.right, source, max_digits))
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Rejected(f"disallowed literal: {type(value).__name__}")
        literal = ast.get_source_segment(source, node) or ""
        # Only plain decimal digits (0x1f, 1_0, 0o7 also denote ints); a second line of
        # defence behind the character check in parse_expression.
        if not re.fullmatch(r"[0-9]+", literal):
            raise _Rejected(f"disallowed literal: {literal!r}")
        if len(literal) > max_digits:
            raise _Rejected(f"literal too long ({len(literal)} digits > {max_digits})")
        return value
    raise _Rejected(f"disallowed syntax: {type(node).__name__}")


def score_completion(numbers: Sequence[int], target: int | float, completion: str, *,
                     format_weight: float = 0.0, max_chars: int = 256,
                     max_literal_digits: int = MAX_NUMBER_DIGITS, tolerance: float = 1e-5,
                     require_answer_tag: bool = False,
                     max_completion_chars: int = MAX_COMPLETION_CHARS) -> Score:
    """Score a Countdown completion; never raises.

    Correct iff the answer uses each given number exactly once and its exact value equals
    ``target``. A non-integer target (a rounded decimal in some files) is matched within
    ``tolerance``, as TinyZero and the ES-paper code do for every target. ``answer_key`` is
    the answer re-rendered with minimal parentheses (so ``((3+4))`` and ``3+4`` vote
    together); ``solution_key`` is ``solution_key(tree)``. ``require_answer_tag``: the ES
    paper's rule, only a closed ``<answer>`` block whose text is digits, operators,
    parentheses and spaces (see the module docstring).
    """
    refused = too_long(completion, max_completion_chars)
    if refused is not None:
        return refused
    text, format_ok = extract_answer(completion, require_answer_tag)
    if text is None:
        return Score(reward=combine_reward(False, format_ok, format_weight), correct=False,
                     answer=None, format_ok=format_ok, error="no answer")
    if require_answer_tag and not _PAPER_CHARS_RE.fullmatch(answer_blocks(completion)[-1]):
        return Score(reward=combine_reward(False, format_ok, format_weight), correct=False,
                     answer=text, format_ok=format_ok,
                     error="disallowed characters for the tagged answer (digits, + - * / ( ) "
                           "and spaces only)")
    try:
        tree = parse_expression(text, max_chars=max_chars, max_literal_digits=max_literal_digits)
    except _Rejected as exc:
        return Score(reward=combine_reward(False, format_ok, format_weight), correct=False,
                     answer=text, format_ok=format_ok, error=str(exc))
    keys = {"answer": text, "format_ok": format_ok, "answer_key": render(tree),
            "solution_key": solution_key(tree)}
    used, given = sorted(leaves(tree)), sorted(numbers)
    if used != given:
        error = f"numbers used {used} but given {given}"
    else:
        try:
            value = evaluate(tree)
            correct = (value == target if isinstance(target, int)
                       else abs(value - Fraction(target)) < tolerance)
            return Score(reward=combine_reward(correct, format_ok, format_weight),
                         correct=correct, **keys)
        except ZeroDivisionError:
            error = "division by zero"
    return Score(reward=combine_reward(False, format_ok, format_weight), correct=False,
                 error=error, **keys)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

def render_prompt(numbers: Sequence[int], target: int) -> str:
    """The compact testbed prompt, e.g. ``"nums 7 3 4 make 25\\n"``."""
    return f"nums {' '.join(str(n) for n in numbers)} make {target}\n"


def random_tree(rng: random.Random, numbers: list[int],
                 slip: tuple[int, int] | None = None) -> tuple[Tree, int, list[str]]:
    """Combine random pairs until one value is left; every intermediate is a positive int.

    ``slip = (k, d)`` (d != 0) writes step k's result off by d (by |d| where d would take it
    below 1) and carries the written value on, as a careless solver would: the steps then end on a value the returned
    tree does not have. Without it no extra random numbers are drawn.
    """
    pool: list[tuple[int, Tree]] = [(n, n) for n in numbers]
    steps: list[str] = []
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        (a, ta), (b, tb) = pool[i], pool[j]
        ops = ["+", "*"]
        if a != b:
            ops.append("-")
        big, small = max(a, b), min(a, b)
        if big % small == 0:
            ops.append("/")
        op = rng.choice(ops)
        if op in "-/" and a < b:
            (a, ta), (b, tb) = (b, tb), (a, ta)
        value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a // b
        if slip is not None and len(steps) == slip[0]:
            value = value + slip[1] if value + slip[1] >= 1 else value + abs(slip[1])
        steps.append(f"{a}{op}{b}={value}")
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(value, (op, ta, tb))]
    value, tree = pool[0]
    return tree, value, steps


def generate(rng: random.Random, num_numbers: int, *, min_number: int = 1,
             max_number: int | None = None, max_target: int = 99,
             max_tries: int = 10_000) -> tuple[Problem, str]:
    """A random solvable problem and a worked solution completion for it.

    Draws ``num_numbers`` numbers from ``[min_number, max_number]`` (default upper bound
    ``3 * num_numbers + 3``: 9, 12, 15 for 2, 3, 4 numbers), combines them in a random
    binary tree with + - * / keeping every intermediate a positive integer (division only
    when exact), and keeps the draw if its value lies in ``[1, max_target]``. The completion
    lists each step ``a*b=c`` in evaluation order, then the minimally parenthesised answer.
    Deterministic given the state of ``rng``.
    """
    if num_numbers < 2:
        raise ValueError(f"countdown needs at least 2 numbers, got {num_numbers}")
    high = 3 * num_numbers + 3 if max_number is None else max_number
    if not 1 <= min_number <= high:
        raise ValueError(f"number range [{min_number}, {high}] is empty or not positive")
    for _ in range(max_tries):
        numbers = [rng.randint(min_number, high) for _ in range(num_numbers)]
        tree, target, steps = random_tree(rng, numbers)
        if 1 <= target <= max_target:
            break
    else:
        raise ValueError(f"no target in [1, {max_target}] after {max_tries} draws of "
                         f"{num_numbers} numbers from [{min_number}, {high}]")
    return worked_example(numbers, target, tree, steps)


def worked_example(numbers: list[int], target: int, tree: Tree,
                   steps: Sequence[str]) -> tuple[Problem, str]:
    """The problem (``numbers``, ``target``) and the completion that writes ``steps`` and
    answers ``tree``."""
    answer = render(tree)
    problem = Problem(id=f"countdown-{'_'.join(map(str, numbers))}-{target}",
                      prompt=render_prompt(numbers, target),
                      gold={"numbers": numbers, "target": target},
                      difficulty=len(numbers), meta={"solution": answer})
    return problem, " ".join(steps) + f" <answer>{answer}</answer>"


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def load_problems(path, limit: int | None = None) -> list[Problem]:
    """Countdown problems from a file.

    Accepts the ES-paper ``countdown.json`` (``id, context, numbers, target`` as a string,
    ``solution``) and the project's JSONL (``id, prompt, numbers, target, difficulty``).
    Without a prompt field the compact prompt is rendered; without ``difficulty`` it is the
    count of numbers.
    """
    records = load_records(path, {"numbers": ("numbers",), "target": ("target",)}, limit)
    problems = []
    for i, rec in enumerate(records):
        numbers, target = _numbers(rec["numbers"], path, i), _target(rec["target"], path, i)
        prompt = rec.get("prompt") or rec.get("context") or render_prompt(numbers, target)
        difficulty = rec.get("difficulty")
        # solution: an answer expression; reference: a whole worked completion (testbed files).
        meta = {k: rec[k] for k in ("solution", "reference") if rec.get(k) is not None}
        problems.append(Problem(id=record_id(rec, i), prompt=prompt,
                                gold={"numbers": numbers, "target": target},
                                difficulty=len(numbers) if difficulty is None else int(difficulty),
                                meta=meta, messages=row_messages(rec, path, i)))
    return problems


def _integer(value, path, index: int) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,18}\s*", value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise BadInput(f"data file {str(path)!r}: record {index} has target {value!r}; the target "
                   f"must be a number (or a string holding one).")


def _target(value, path, index: int) -> int | float:
    # countdown.json has 43 targets such as "27.4" or "266.6666666666667": float reprs of
    # values reached through a division. They are kept (the ES paper evaluates on them) as
    # floats and matched within a tolerance, as the original code did; see score_completion.
    if isinstance(value, str) and not re.fullmatch(r"\s*-?[0-9]{1,18}\s*", value):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        return value
    return _integer(value, path, index)


def _numbers(value, path, index: int) -> list[int]:
    numbers = None
    if isinstance(value, (list, tuple)) and value:
        try:
            numbers = [_integer(v, path, index) for v in value]
        except BadInput:
            pass
    # A number the verifier can never see written (negative, or longer than its literal
    # limit) would make the problem unsolvable: refuse it here rather than score it 0.
    if numbers is None or any(not 0 <= n < 10 ** MAX_NUMBER_DIGITS for n in numbers):
        raise BadInput(f"data file {str(path)!r}: record {index} has numbers {value!r}; numbers "
                       f"must be a non-empty list of integers from 0 to "
                       f"{10 ** MAX_NUMBER_DIGITS - 1} (an answer writes each as a plain "
                       f"literal of at most {MAX_NUMBER_DIGITS} digits).")
    return numbers


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------

class CountdownTask(InProcessTask):
    """Countdown problems (generated or from a file) with the AST-based verifier."""

    name = "countdown"

    def __init__(self, cfg: TaskConfig, *, min_number: int = 1, max_number: int | None = None,
                 max_target: int = 99, max_answer_chars: int = 256):
        tiers = cfg.tiers or (2, 3, 4)
        check_tiers("countdown", tiers, 2, 8)
        self.cfg, self._tiers = cfg, tiers
        self._gen = {"min_number": min_number, "max_number": max_number,
                     "max_target": max_target}
        self._limits = {"max_chars": max_answer_chars,
                        "require_answer_tag": cfg.require_answer_tag,
                        "max_completion_chars": cfg.max_completion_chars}
        self._problems: list[Problem] | None = None

    def problems(self) -> list[Problem]:
        """The task's problems (loaded or generated once, then reused)."""
        if self._problems is None:
            if self.cfg.data is not None:
                self._problems = choose_rows(
                    load_problems(data_path(self.cfg), read_limit(self.cfg)), self.cfg)
            else:
                made = distinct_problems(
                    lambda rng, tier: generate(rng, tier, **self._gen),
                    lambda p: (tuple(sorted(p.gold["numbers"])), p.gold["target"]),
                    self.cfg, self._tiers)
                self._problems = choose_rows(made, self.cfg)
        return list(self._problems)

    def _score(self, problem: Problem, completion: str) -> Score:
        return score_completion(problem.gold["numbers"], problem.gold["target"], completion,
                                format_weight=self.cfg.format_weight, **self._limits)


@register_task("countdown", answer_tag=True)
def _build(cfg: TaskConfig) -> CountdownTask:
    return CountdownTask(cfg)
