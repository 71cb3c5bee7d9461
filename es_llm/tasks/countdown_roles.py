"""Countdown in several roles: the formats of the multi-role testbed model and their checks.

The student knows one role: solve a problem with worked steps. The reasoning testbed model
(``reasoning/`` of a testbed build) also learns the roles the test-time methods of
``es_llm.testtime`` need, each marked by the prompt's first word::

    solve   "nums 7 3 4 make 25\\n"          -> "7*3=21 21+4=25 <answer>7*3+4</answer>"
    direct  "direct nums 7 3 4 make 25\\n"   -> "<answer>7*3+4</answer>"
    facts   "facts nums 7 3 4 make 25\\n"    -> "25=21+4 21=7*3\\n7*3=21 21+4=25 <answer>7*3+4</answer>"
    review  "review nums 7 3 4 make 25\\n<trace>\\n"            -> "ok" | "wrong at step 2"
    revise  "revise nums 7 3 4 make 25\\n<trace>\\n<critique>\\n" -> a corrected trace
    formalize "formalize nums 7 3 4 make 25\\n7*3+4\\n" -> "thm 7*3+4 = 25 ; 7*3+4 uses 3 4 7"

``solve`` is the student's prompt unchanged, so every other tool (eval, ES, the gradient
methods, compare) runs on the reasoning model exactly as on the student. ``facts`` is the
testbed's form of concretised propositions (CPP): before solving, the model states the
concrete sub-results the solution needs, top down from the target (``25=21+4`` then
``21=7*3``). A critique is ``wrong at step k`` (a reviewer's localised verdict),
``wrong`` (the verifier's message: the answer fails, no location) or ``check`` (no
information: self-repair).

Review traces carry planted errors whose label the verifier computes (``first_wrong_step``):
a misread given number at step k (``8*3=24`` for the given 7, carried on), or a wrong
operator at the last step (arithmetic right, target missed). A revise example's target is
the clean trace the error was planted in, so it keeps the valid prefix before the flagged
step. Everything here is a pure function of the ``random.Random`` passed in; model text is
parsed with regular expressions and scored with the Countdown verifier, never evaluated.

``formalize`` is the autoformaliser of BASE (``es_llm.testtime.selection``): it writes the
statement that a candidate answer solves the problem, in a small formal language whose
checker is exact (``statement``); the answer fills two slots, as a Lean theorem names its
answer more than once. Its training candidates are the clean answer or a planted error's
answer, so it learns to transcribe right and wrong answers alike; what it writes is
learnt, so it can misplace a number, the target or the answer like any autoformaliser.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from es_llm.tasks import countdown
from es_llm.tasks.base import Problem

ROLES = ("solve", "direct", "facts", "review", "revise", "formalize")
# Shares of the roles in the reasoning model's training examples.
ROLE_SHARES = (("solve", 0.25), ("direct", 0.15), ("facts", 0.15), ("review", 0.175),
               ("revise", 0.175), ("formalize", 0.1))
TIERS = (2, 3, 4)
# Largest given number (the default testbed's range): 2-number problems need a range wide
# enough that the held-out sets leave most of the tier to training.
MAX_NUMBER = 15
SELF_REPAIR, NO_LOCATION = "check", "wrong"
MISREAD_SIZES = (-3, -2, -1, 1, 2, 3)

STEP_RE = re.compile(r"([0-9]{1,9})([+\-*/])([0-9]{1,9})=([0-9]{1,12})")
_PROBLEM_RE = re.compile(r"(?:[a-z]+ )?nums ((?:[0-9]{1,6} )+)make ([0-9]{1,9})\n?")
_VERDICT_RE = re.compile(r"\s*(ok|wrong at step ([0-9]{1,3})|wrong)\s*")


@dataclass(frozen=True)
class Step:
    """One written step ``a op b=c`` (``c`` as written, right or not)."""

    a: int
    op: str
    b: int
    c: int

    def text(self) -> str:
        return f"{self.a}{self.op}{self.b}={self.c}"


def role_prompt(role: str, numbers: Sequence[int], target: int, trace: str | None = None,
                critique: str | None = None) -> str:
    """The prompt of ``role`` for the problem (``trace`` for review and revise, and the
    candidate answer for formalize; ``critique`` for revise)."""
    head = countdown.render_prompt(numbers, target)
    if role == "solve":
        return head
    if role in ("direct", "facts"):
        return f"{role} {head}"
    if role == "review":
        return f"review {head}{_one_line(trace)}\n"
    if role == "revise":
        return f"revise {head}{_one_line(trace)}\n{_one_line(critique)}\n"
    if role == "formalize":
        return f"formalize {head}{_one_line(trace)}\n"
    raise ValueError(f"unknown role {role!r}; valid roles are: {', '.join(ROLES)}")


def _one_line(text: str | None) -> str:
    if text is None:
        raise ValueError("review and revise prompts need a trace (and revise a critique), "
                         "formalize prompts a candidate answer")
    return " ".join(text.split())


def statement(numbers: Sequence[int], target: int, answer: str) -> str:
    """The formal statement that ``answer`` solves the problem: its value is the target and
    it uses exactly the given numbers (listed in increasing order), the answer in two slots:
    ``thm 7*3+4 = 25 ; 7*3+4 uses 3 4 7``."""
    a = " ".join(answer.split())
    return f"thm {a} = {target} ; {a} uses {' '.join(map(str, sorted(numbers)))}"


def parse_problem(prompt: str) -> tuple[list[int], int] | None:
    """``(numbers, target)`` from a prompt's first line, or None if it is not a Countdown
    prompt in the testbed format."""
    m = _PROBLEM_RE.match(prompt.split("\n", 1)[0] + "\n")
    if m is None:
        return None
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def trace_part(completion: str) -> str:
    """The worked trace of a completion: a facts completion's second line, else all of it."""
    lines = completion.strip("\n").split("\n")
    return lines[-1] if len(lines) > 1 else completion


def parse_steps(completion: str) -> list[Step | None]:
    """The steps written before the answer tag (None for a word that is not a step)."""
    body = trace_part(completion).split("<answer>", 1)[0]
    steps: list[Step | None] = []
    for word in body.split():
        m = STEP_RE.fullmatch(word)
        steps.append(Step(int(m[1]), m[2], int(m[3]), int(m[4])) if m else None)
    return steps


def _apply(a: int, op: str, b: int) -> Fraction | None:
    if op == "/":
        return None if b == 0 else Fraction(a, b)
    return Fraction(a + b if op == "+" else a - b if op == "-" else a * b)


def first_wrong_step(numbers: Sequence[int], target: int, completion: str) -> int | None:
    """The verifier's label of a trace: None if every step checks and the answer is correct,
    else the 1-based index of the first step that is not a step, uses a value that is not
    available (given numbers and earlier results, each once), or whose result is wrong; a
    trace whose steps all check but end off the target, or whose answer fails, is wrong at
    its last step (step 1 when it has none)."""
    steps = parse_steps(completion)
    pool = list(numbers)
    for k, step in enumerate(steps, start=1):
        if step is None or step.a not in pool:
            return k
        pool.remove(step.a)
        if step.b not in pool or _apply(step.a, step.op, step.b) != step.c:
            return k
        pool.remove(step.b)
        pool.append(step.c)
    answer_ok = countdown.score_completion(numbers, target, completion).correct
    if answer_ok and pool == [target] and steps:
        return None
    return max(len(steps), 1)


def answer_value(numbers: Sequence[int], completion: str) -> Fraction | None:
    """The exact value of a completion's answer if it is a valid expression over exactly the
    given numbers, else None: the task's answer equivalence (two answers agree when their
    values are equal), which needs no gold answer."""
    text, _ = countdown.extract_answer(completion)
    if text is None:
        return None
    try:
        tree = countdown.parse_expression(text)
        if sorted(countdown.leaves(tree)) != sorted(numbers):
            return None
        return countdown.evaluate(tree)
    except (countdown._Rejected, ZeroDivisionError):
        return None


def parse_verdict(text: str) -> tuple[str, int | None] | None:
    """A review's verdict: ``("ok", None)``, ``("wrong", k)``, ``("wrong", None)``; None if
    the text is no verdict (the reviewer failed to answer)."""
    m = _VERDICT_RE.fullmatch(text)
    if m is None:
        return None
    if m.group(1) == "ok":
        return "ok", None
    return "wrong", (int(m.group(2)) if m.group(2) else None)


def critique_line(verdict: tuple[str, int | None] | None) -> str:
    """The critique a revise prompt carries for a review verdict."""
    if verdict is None or verdict[0] == "ok":
        return SELF_REPAIR
    return f"wrong at step {verdict[1]}" if verdict[1] else NO_LOCATION


def facts_line(tree) -> str:
    """The sub-results a solution needs, top down: ``value=left op right`` for the root and
    then every inner node in pre-order."""
    parts: list[str] = []

    def visit(node) -> None:
        if isinstance(node, int):
            return
        op, left, right = node
        parts.append(f"{countdown.evaluate(node)}={countdown.evaluate(left)}{op}"
                     f"{countdown.evaluate(right)}")
        visit(left)
        visit(right)

    visit(tree)
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# Traces with planted errors
# ---------------------------------------------------------------------------------------------

def _plan(numbers: Sequence[int], steps: Sequence[Step]) -> list[tuple[int, str, int]]:
    """Each step as (index of a, op, index of b) into the list of values (the given numbers,
    then each step's result), so a changed value can be carried on."""
    values, free, plan = list(numbers), list(range(len(numbers))), []
    for step in steps:
        i = next(x for x in free if values[x] == step.a)
        j = next(x for x in free if x != i and values[x] == step.b)
        free = [x for x in free if x not in (i, j)] + [len(values)]
        values.append(step.c)
        plan.append((i, step.op, j))
    return plan


def _render(numbers: Sequence[int], plan, misread: tuple[int, int] | None = None,
            last_op: str | None = None) -> tuple[str, object] | None:
    """The trace and answer tree of ``plan`` with given number ``misread[0]`` written as
    ``misread[1]`` or the last step's operator replaced; None when a step would leave the
    positive integers."""
    values: list[int] = list(numbers)
    trees: list[object] = list(numbers)
    if misread is not None:
        values[misread[0]] = trees[misread[0]] = misread[1]
    texts = []
    for k, (i, op, j) in enumerate(plan):
        if last_op is not None and k == len(plan) - 1:
            op = last_op
        value = _apply(values[i], op, values[j])
        if value is None or value.denominator != 1 or value < 1:
            return None
        texts.append(Step(values[i], op, values[j], int(value)).text())
        values.append(int(value))
        trees.append((op, trees[i], trees[j]))
    return " ".join(texts), trees[-1]


def _steps_of(completion: str) -> list[Step]:
    return [s for s in parse_steps(completion) if s is not None]


def planted_error(rng: random.Random, problem: Problem, completion: str
                  ) -> tuple[str, int] | None:
    """A wrong version of a clean worked ``completion`` and its verifier label: a misread
    given number at a random step (half the time) or a wrong last operator; None if the
    drawn error cannot be written (the caller draws again)."""
    numbers, target = problem.gold["numbers"], problem.gold["target"]
    steps = _steps_of(completion)
    plan = _plan(numbers, steps)
    if rng.random() < 0.5:
        k = rng.randrange(len(plan))
        i, _, j = plan[k]
        leaves = [x for x in (i, j) if x < len(numbers)]
        if not leaves:
            return None
        x = rng.choice(leaves)
        value = numbers[x] + rng.choice(MISREAD_SIZES)
        made = _render(numbers, plan, misread=(x, value)) if value >= 1 else None
    else:
        op = rng.choice([o for o in "+-*/" if o != plan[-1][1]])
        made = _render(numbers, plan, last_op=op)
    if made is None:
        return None
    trace, tree = made
    wrong = f"{trace} <answer>{countdown.render(tree)}</answer>"
    label = first_wrong_step(numbers, target, wrong)
    return (wrong, label) if label is not None else None


# ---------------------------------------------------------------------------------------------
# Training examples and held-out problems
# ---------------------------------------------------------------------------------------------

def held_out(rng: random.Random, tier: int) -> tuple[Problem, str]:
    """A held-out problem in the solve role with its clean worked solution."""
    return countdown.generate(rng, tier, max_number=MAX_NUMBER)


def generate(rng: random.Random, tier: int) -> tuple[Problem, str]:
    """One training example: a problem of ``tier`` in a role drawn by ``ROLE_SHARES``. The
    returned problem has the role's prompt and the Countdown gold (so held-out problems are
    excluded in every role)."""
    names, shares = zip(*ROLE_SHARES)
    role = rng.choices(names, weights=shares)[0]
    while True:
        problem, clean = countdown.generate(rng, tier, max_number=MAX_NUMBER)
        made = _example(rng, role, problem, clean)
        if made is not None:
            prompt, completion = made
            return Problem(id=problem.id, prompt=prompt, gold=problem.gold,
                           difficulty=problem.difficulty, meta={"role": role}), completion


def _example(rng: random.Random, role: str, problem: Problem, clean: str
             ) -> tuple[str, str] | None:
    numbers, target = problem.gold["numbers"], problem.gold["target"]
    answer_part = clean[clean.index("<answer>"):]
    if role == "solve":
        return role_prompt(role, numbers, target), clean
    if role == "direct":
        return role_prompt(role, numbers, target), answer_part
    if role == "facts":
        tree = countdown.parse_expression(problem.meta["solution"])
        return role_prompt(role, numbers, target), f"{facts_line(tree)}\n{clean}"
    if role == "review" and rng.random() < 0.5:
        return role_prompt(role, numbers, target, trace=clean), "ok"
    if role == "formalize":
        # Half the candidates are right, half a planted error's answer.
        made = (clean, None) if rng.random() < 0.5 else planted_error(rng, problem, clean)
        if made is None:
            return None
        answer, _ = countdown.extract_answer(made[0])
        return (role_prompt(role, numbers, target, trace=answer),
                statement(numbers, target, answer))
    if role == "revise" and rng.random() < 0.2:
        # Self-repair on a trace that was right: nothing to change.
        return role_prompt(role, numbers, target, trace=clean, critique=SELF_REPAIR), clean
    wrong = planted_error(rng, problem, clean)
    if wrong is None:
        return None
    if role == "review":
        return role_prompt(role, numbers, target, trace=wrong[0]), f"wrong at step {wrong[1]}"
    draw = rng.random()
    critique = (f"wrong at step {wrong[1]}" if draw < 0.5 else
                NO_LOCATION if draw < 0.75 else SELF_REPAIR)
    return role_prompt(role, numbers, target, trace=wrong[0], critique=critique), clean
