"""pyfunc: write a one-line Python function from input/output examples (the testbed's code task).

A problem is a function ``f`` drawn from a small family of expressions with random constants;
the prompt shows its signature and three examples, and hidden tests (eight other inputs) judge
the completion in the sandbox (``code.py``). Procedural and seeded, in four tiers::

    tier 1  int -> int, one operation          x + 4, x * 3, x % 5, 7 - x
    tier 2  int -> int, two operations         x * 3 + 2, (x + 1) * 4, abs(x - 6), max(x, 5)
    tier 3  list of ints -> int or list        sum(xs), sorted(xs), [v * 2 for v in xs]
    tier 4  strings, and lists composed        s.upper(), s.count('b'), max(xs) - min(xs)

    prompt      "# f(3) == 7; f(0) == 1; f(5) == 11\\ndef f(x):\\n"
    completion  "    return x * 2 + 1\\n"

The program judged is the prompt followed by the completion. Inputs are small (ints 0..20,
lists of 1..5 digits, strings of 1..6 letters from 'abcde'), and examples are drawn until no
other function of the same tier agrees with the answer on the shown examples yet differs on
the hidden tests, so every problem is determined by what it shows.
"""

from __future__ import annotations

import itertools
import random
from typing import Callable

from es_llm.errors import BadInput
from es_llm.tasks.base import Problem
from es_llm.tasks.code import CodeTaskBase
from es_llm.tasks.loading import load_records, record_id, row_messages
from es_llm.tasks.registry import (TaskConfig, check_tiers, file_or_generated,
                                   register_task)
from es_llm.sandbox import io_check

TIERS = (1, 2, 3, 4)
SHOWN, HIDDEN = 3, 8
_LETTERS = "abcde"


# A family: (argument name, expression template, constants it takes, the function itself).
Family = tuple[str, str, str, Callable]


def _families(tier: int) -> list[Family]:
    """The expression families of ``tier``; ``{a}``/``{b}`` are small ints, ``{c}``/``{d}``
    letters. The callable takes the input and the constants in that order."""
    if tier == 1:
        return [("x", "x + {a}", "a", lambda x, a: x + a),
                ("x", "x - {a}", "a", lambda x, a: x - a),
                ("x", "x * {a}", "a", lambda x, a: x * a),
                ("x", "x // {a}", "a", lambda x, a: x // a),
                ("x", "x % {a}", "a", lambda x, a: x % a),
                ("x", "{a} - x", "a", lambda x, a: a - x)]
    if tier == 2:
        return [("x", "x * {a} + {b}", "ab", lambda x, a, b: x * a + b),
                ("x", "(x + {a}) * {b}", "ab", lambda x, a, b: (x + a) * b),
                ("x", "x * x + {a}", "a", lambda x, a: x * x + a),
                ("x", "abs(x - {a})", "a", lambda x, a: abs(x - a)),
                ("x", "max(x, {a})", "a", lambda x, a: max(x, a)),
                ("x", "min(x, {a})", "a", lambda x, a: min(x, a)),
                ("x", "x // {a} + {b}", "ab", lambda x, a, b: x // a + b)]
    if tier == 3:
        return [("xs", "sum(xs)", "", sum), ("xs", "max(xs)", "", max), ("xs", "min(xs)", "", min),
                ("xs", "len(xs)", "", len), ("xs", "sorted(xs)", "", sorted),
                ("xs", "xs[::-1]", "", lambda xs: xs[::-1]),
                ("xs", "xs[0]", "", lambda xs: xs[0]),
                ("xs", "[v * {a} for v in xs]", "a", lambda xs, a: [v * a for v in xs]),
                ("xs", "[v + {a} for v in xs]", "a", lambda xs, a: [v + a for v in xs]),
                ("xs", "[v for v in xs if v > {a}]", "a", lambda xs, a: [v for v in xs if v > a]),
                ("xs", "xs.count({a})", "a", lambda xs, a: xs.count(a)),
                ("xs", "sum(v * v for v in xs)", "", lambda xs: sum(v * v for v in xs))]
    return [("s", "s.upper()", "", str.upper), ("s", "s[::-1]", "", lambda s: s[::-1]),
            ("s", "s.count('{c}')", "c", lambda s, c: s.count(c)),
            ("s", "s.replace('{c}', '{d}')", "cd", lambda s, c, d: s.replace(c, d)),
            ("s", "s[:{a}]", "a", lambda s, a: s[:a]), ("s", "s[{a}:]", "a", lambda s, a: s[a:]),
            ("s", "len(s) * {a}", "a", lambda s, a: len(s) * a),
            ("s", "s + s", "", lambda s: s + s),
            ("xs", "sorted(xs)[::-1]", "", lambda xs: sorted(xs)[::-1]),
            ("xs", "sum(xs) * {a}", "a", lambda xs, a: sum(xs) * a),
            ("xs", "max(xs) - min(xs)", "", lambda xs: max(xs) - min(xs)),
            ("xs", "[v % {a} for v in xs]", "a", lambda xs, a: [v % a for v in xs]),
            ("xs", "[v for v in xs if v % 2 == 0]", "", lambda xs: [v for v in xs if v % 2 == 0])]


def _constant_values(name: str) -> list:
    return list(_LETTERS) if name in "cd" else list(range(2, 10))


def _constants(family: Family) -> list[tuple]:
    """Every constant assignment of ``family`` (two letters must differ)."""
    combos = itertools.product(*[_constant_values(n) for n in family[2]])
    return [c for c in combos if not (family[2] == "cd" and c[0] == c[1])]


def _draw_input(rng: random.Random, arg: str):
    if arg == "x":
        return rng.randint(0, 20)
    if arg == "xs":
        return [rng.randint(0, 9) for _ in range(rng.randint(1, 5))]
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(1, 6)))


def _outputs(family: Family, consts: tuple, inputs: list) -> list:
    return [family[3](x, *consts) for x in inputs]


def render_prompt(arg: str, shown: list[tuple]) -> str:
    examples = "; ".join(f"f({x!r}) == {y!r}" for x, y in shown)
    return f"# {examples}\ndef f({arg}):\n"


def _determined(family: Family, consts: tuple, shown_in: list, hidden_in: list,
                rivals: list[tuple[Family, tuple]]) -> bool:
    """No rival with the same argument agrees on the shown inputs but not the hidden ones."""
    want_shown = _outputs(family, consts, shown_in)
    want_hidden = _outputs(family, consts, hidden_in)
    for rival, rc in rivals:
        if rival[0] == family[0] and _outputs(rival, rc, shown_in) == want_shown \
                and _outputs(rival, rc, hidden_in) != want_hidden:
            return False
    return True


def generate(rng: random.Random, tier: int) -> tuple[Problem, str]:
    """One problem of ``tier`` and its one-line solution (a pure function of ``rng``)."""
    families = _families(tier)
    rivals = [(f, c) for f in families for c in _constants(f)]
    while True:
        family = rng.choice(families)
        consts = rng.choice(_constants(family))
        inputs: list = []
        while len(inputs) < SHOWN + HIDDEN:
            x = _draw_input(rng, family[0])
            if x not in inputs:
                inputs.append(x)
        shown_in, hidden_in = inputs[:SHOWN], inputs[SHOWN:]
        if _determined(family, consts, shown_in, hidden_in, rivals):
            break
    names = dict(zip(family[2], consts))
    body = family[1].format(**names)
    shown = list(zip(shown_in, _outputs(family, consts, shown_in)))
    tests = [[[x], y] for x, y in zip(hidden_in, _outputs(family, consts, hidden_in))]
    completion = f"    return {body}\n"
    problem = Problem(id="", prompt=render_prompt(family[0], shown),
                      gold={"entry_point": "f", "tests": tests}, difficulty=tier,
                      meta={"solution": completion})
    return problem, completion


def load_problems(path, limit: int | None = None) -> list[Problem]:
    """Problems from a .jsonl of ``id, prompt, tests`` (+ ``entry_point``, ``difficulty``,
    ``solution``): the testbed's held-out files, or any set in the same format, where
    ``tests`` is a list of ``[args, expected]`` pairs of plain JSON data."""
    records = load_records(path, {"prompt": ("prompt",), "tests": ("tests",)}, limit)
    problems = []
    for i, rec in enumerate(records):
        tests = rec["tests"]
        if not (isinstance(tests, list) and tests and all(
                isinstance(t, list) and len(t) == 2 and isinstance(t[0], list) for t in tests)):
            raise BadInput(f"data file {str(path)!r}: record {i} has tests {str(tests)[:80]!r}; "
                           f"tests must be a non-empty list of [args, expected] pairs, args a "
                           f"list.")
        entry = rec.get("entry_point") or "f"
        meta = {k: rec[k] for k in ("solution", "reference") if rec.get(k) is not None}
        problems.append(Problem(id=record_id(rec, i), prompt=rec["prompt"],
                                gold={"entry_point": entry, "tests": tests},
                                difficulty=int(rec.get("difficulty") or 0), meta=meta,
                                messages=row_messages(rec, path, i)))
    return problems


class PyFuncTask(CodeTaskBase):
    """Generated (or loaded) pyfunc problems, judged by their hidden tests in the sandbox."""

    name = "pyfunc"

    def __init__(self, cfg: TaskConfig):
        tiers = cfg.tiers or TIERS
        check_tiers("pyfunc", tiers, 1, len(TIERS))
        self._tiers = tiers
        self._problems: list[Problem] | None = None
        super().__init__(cfg)

    def problems(self) -> list[Problem]:
        if self._problems is None:
            self._problems = file_or_generated(self.cfg, load_problems, generate,
                                               lambda p: p.prompt, self._tiers)
        return list(self._problems)

    def program(self, problem: Problem, completion: str) -> str:
        # Only the function's body belongs to the model: what follows a blank line or a new
        # top-level statement is not part of f.
        body = []
        for line in completion.split("\n"):
            if line and not line[0].isspace():
                break
            body.append(line)
        return problem.task_prompt + "\n".join(body)[:4000]

    def make_check(self, problem: Problem):
        return io_check([(tuple(args), expected) for args, expected in problem.gold["tests"]])


@register_task("pyfunc")
def _build(cfg: TaskConfig) -> PyFuncTask:
    return PyFuncTask(cfg)
