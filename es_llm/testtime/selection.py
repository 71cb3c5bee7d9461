"""BASE answer selection (Feng & Shi 2026, "Formalize Once, Edit the Rest"): formalise one
base candidate, derive the other K-1 checkable statements by editing its answer in place.

BASE formalises into Lean and checks with a Lean server. Lean cannot be installed on the
project's machines (no offline package ships it or Mathlib), so the formal language here
is a small exact-fraction statement over the problem, built from the prompt alone (never
from the gold answer)::

    numbers [3, 4, 7] ; target 25 ; value(7*3+4) == target and multiset(7*3+4) == numbers

``formalize`` is the one expensive call (the autoformaliser in BASE); ``edit`` is R1, the
rule-based edit: replace every whole occurrence of the base answer inside the statement's
answer slots, pasting only safe candidates (digits, ``+ - * / ( )`` and spaces); ``check``
parses the statement and decides it with ``fractions.Fraction`` arithmetic, never
``eval``. Selection: ``first_pass`` takes the first candidate in rank order (mean token
log-probability) whose statement checks; ``unique_pass`` selects only when exactly one
distinct answer checks (Countdown often has several correct answers, so it abstains more).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from es_llm.tasks import countdown
from es_llm.tasks.countdown_roles import parse_problem
from es_llm.testtime.methods import MethodInput, MethodResult, outcome, prompt, register_method

_SAFE_RE = re.compile(r"[0-9+\-*/() ]{1,64}")
_STATEMENT_RE = re.compile(r"numbers \[([0-9, ]*)\] ; target ([0-9]{1,9}) ; "
                           r"value\((.*)\) == target and multiset\((.*)\) == numbers")


@dataclass(frozen=True)
class Statement:
    """A checkable statement and the answer text its slots hold."""

    text: str
    slot: str


def safe(answer: str | None) -> bool:
    """Whether an answer may be pasted into a statement."""
    return answer is not None and _SAFE_RE.fullmatch(answer.strip()) is not None


def formalize(problem_prompt: str, answer: str) -> Statement | None:
    """The statement that ``answer`` solves the problem of ``problem_prompt``; None if the
    prompt is no Countdown problem or the answer is not safe to paste."""
    parsed = parse_problem(problem_prompt)
    if parsed is None or not safe(answer):
        return None
    numbers, target = parsed
    a = answer.strip()
    return Statement(f"numbers [{', '.join(map(str, sorted(numbers)))}] ; target {target} ; "
                     f"value({a}) == target and multiset({a}) == numbers", a)


def edit(statement: Statement, answer: str | None) -> Statement | None:
    """R1: the statement with ``answer`` in place of every whole slot occurrence of the base
    answer (between the slot's parentheses); None for an unsafe answer."""
    if not safe(answer):
        return None
    a = answer.strip()
    text = re.sub(r"(?<=\()" + re.escape(statement.slot) + r"(?=\) ==)", lambda _: a,
                  statement.text)
    return Statement(text, a)


def check(statement: Statement) -> bool:
    """Whether the statement holds: both slots hold the same expression, over exactly the
    listed numbers, whose exact value is the target."""
    m = _STATEMENT_RE.fullmatch(statement.text)
    if m is None or m[3] != m[4]:
        return False
    numbers = [int(x) for x in m[1].split(",") if x.strip()]
    try:
        tree = countdown.parse_expression(m[3])
        return (sorted(countdown.leaves(tree)) == numbers
                and countdown.evaluate(tree) == int(m[2]))
    except (countdown._Rejected, ZeroDivisionError):
        return False


def select(answers: list[str | None], problem_prompt: str) -> dict:
    """Formalise the first safe candidate (rank order), edit it for the rest, check all.

    Returns the index chosen by ``first_pass`` and ``unique_pass`` (None when nothing is
    chosen), the pass flags, and the formaliser and checker calls made.
    """
    base = next((i for i, a in enumerate(answers) if safe(a)), None)
    statement = formalize(problem_prompt, answers[base]) if base is not None else None
    passes, checks = [False] * len(answers), 0
    if statement is not None:
        for i, a in enumerate(answers):
            edited = statement if i == base else edit(statement, a)
            if edited is not None:
                checks += 1
                passes[i] = check(edited)
    passing = [i for i, ok in enumerate(passes) if ok]
    distinct = {countdown.render(countdown.parse_expression(answers[i].strip()))
                for i in passing}
    return {"first_pass": passing[0] if passing else None,
            "unique_pass": passing[0] if len(distinct) == 1 else None,
            "passes": passes, "formalizer_calls": int(statement is not None),
            "checker_calls": checks, "ambiguous": len(distinct) > 1}


@register_method("base_select", roles=("solve",), min_budget=2, unit="candidates")
def base_select(inp: MethodInput) -> MethodResult:
    """K solve candidates ranked by mean token log-probability; BASE selection over them."""
    outs = inp.gen.draw(inp.label, "candidate", [(p, prompt(p, "solve")) for p in inp.problems],
                        inp.budget, inp.cfg.max_tokens, logprobs=True)
    rows = []
    for p, gens in zip(inp.problems, outs):
        ranked = sorted(gens, key=lambda g: -float(np.mean(g.logprobs)) if g.logprobs else 0.0)
        chosen = select([g.answer for g in ranked], prompt(p, "solve"))
        first = ranked[chosen["first_pass"]] if chosen["first_pass"] is not None else None
        unique = ranked[chosen["unique_pass"]] if chosen["unique_pass"] is not None else None
        rows.append(outcome(p, gens, first, unique_pass=bool(unique and unique.correct),
                            formalizer_calls=chosen["formalizer_calls"],
                            checker_calls=chosen["checker_calls"],
                            ambiguous=chosen["ambiguous"]))
    gt = [r["covered"] for r in rows]
    k = inp.budget
    return MethodResult(rows, {
        "gt_at_k": float(np.mean(gt)),
        "accuracy_first_pass": float(np.mean([r["answered"] for r in rows])),
        "accuracy_unique_pass": float(np.mean([r["unique_pass"] for r in rows])),
        "conditional_first_pass": (float(np.mean([r["answered"] for r in rows if r["covered"]]))
                                   if any(gt) else None),
        "conditional_unique_pass": (float(np.mean([r["unique_pass"] for r in rows
                                                   if r["covered"]])) if any(gt) else None),
        "ambiguous_share": float(np.mean([r["ambiguous"] for r in rows])),
        "formalizer_calls_per_problem": float(np.mean([r["formalizer_calls"] for r in rows])),
        "formalizer_calls_if_every_candidate": float(k),
        "checker_calls_per_problem": float(np.mean([r["checker_calls"] for r in rows]))})
