"""Test-time strategies as registered functions over one typed input.

A strategy takes a ``MethodInput`` (the problems, its budget level, the ``Generations``
that draw and count everything, the settings, and what its ``prepare`` step computed once
for the run) and returns one outcome per problem: ``covered`` (some output it produced is
correct: the oracle view of the success-vs-tokens curve, ``S(b)`` of metrics.md 5.1) and
``answered`` (the one answer it commits to is correct), plus its own statistics. Its cost is
read from the ledger of ``Generations``, never reported by the method.

The budget level means, per strategy: samples (``independent``, ``direct``, ``cpp``), thinking
samples after a disagreement (``dart``), branches (``ttel``), candidates (``base_select``,
``formalize_all``, ``base_oracle``),
peers (``per``, ``broadcast``, ``discussion``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from es_llm.config import check_choices, choice
from es_llm.errors import BadInput
from es_llm.tasks import Problem, knowledge
from es_llm.tasks.countdown_roles import STEP_RE, role_prompt
from es_llm.testtime.generations import Gen, Generations, countdown_value
from populations.registry import Registry


# TTEL's branching variants (``BranchInput -> list[Branched]``), registered by ttel.py; the
# registry lives here so the settings can name its choices without importing ttel.py, which
# imports this module.
BRANCHINGS: Registry[Callable] = Registry("ttel branching")


@dataclass(frozen=True)
class TestTimeSettings:
    __test__ = False  # not a pytest test class, despite its name

    # Sampling temperature of every generation.
    temperature: float = 1.0
    # Longest solve / facts / revise completion, and longest review and plan line, in tokens.
    max_tokens: int = 96
    review_tokens: int = 20
    plan_tokens: int = 48
    # DART: calibration problems (the model's held-out rl set unless calibration_data names
    # a file), solve samples per calibration problem, the safety margin on the isotonic
    # budget map, and the smallest thinking budget.
    calibration_problems: int = 64
    calibration_samples: int = 4
    calibration_data: str | None = None
    dart_margin: float = 0.2
    dart_min_tokens: int = 16
    # DART: lower thinking caps at which the report also gives the share of the thinking
    # samples that cap would have cut (a sample that ended after n tokens fits a cap >= n),
    # so the budget stage is read where it binds.
    dart_caps: tuple[int, ...] = (24, 32, 48, 64)
    # TTEL: the feedback gap (nats; a segment's largest token gap) at which a segment is the
    # error, the earliest such segment winning; 0 turns the threshold off: the segment of
    # the largest gap, which is also the fallback when no segment reaches the threshold.
    ttel_threshold: float = 0.0
    # TTEL: how branches are drawn: parallel (localise once, every branch from the one kept
    # prefix) or sequential (one branch at a time, each rejected branch localised afresh).
    ttel_branching: str = choice("parallel", lambda: BRANCHINGS)
    # BASE: the longest statement the formalize role may write, in tokens, and its sampling
    # temperature (0: greedy, a formaliser transcribes rather than explores).
    formalize_tokens: int = 64
    formalize_temperature: float = 0.0

    def __post_init__(self):
        check_choices(self, "testtime.")
        for name in ("max_tokens", "review_tokens", "plan_tokens", "calibration_problems",
                     "calibration_samples", "dart_min_tokens", "formalize_tokens"):
            if getattr(self, name) < 1:
                raise BadInput(f"testtime.{name} must be at least 1, got {getattr(self, name)}.")
        if not self.dart_caps or any(c < 1 for c in self.dart_caps):
            raise BadInput(f"testtime.dart_caps must be a non-empty list of positive token "
                           f"caps, got {list(self.dart_caps)}.")
        if not (math.isfinite(self.ttel_threshold) and self.ttel_threshold >= 0):
            raise BadInput(f"testtime.ttel_threshold must lie in [0, inf): a feedback gap in "
                           f"nats at which a segment counts as the error, or 0 for the "
                           f"segment of the largest gap; got {self.ttel_threshold}.")
        if not self.temperature > 0:
            raise BadInput(f"testtime.temperature must be > 0 (the methods sample), got "
                           f"{self.temperature}.")
        if not (math.isfinite(self.formalize_temperature) and self.formalize_temperature >= 0):
            raise BadInput(f"testtime.formalize_temperature must be >= 0 (0 is greedy), got "
                           f"{self.formalize_temperature}.")
        if not self.dart_margin >= 0:
            raise BadInput(f"testtime.dart_margin must be >= 0, got {self.dart_margin}.")


@dataclass(frozen=True)
class TaskFormat:
    """How one task's problems are put to a multi-role model: ``prompt(problem, role,
    **kw)`` writes a role's prompt, ``facts_hold(completion, problem)`` says whether a
    facts line is true (CPP's statistic) and ``value(problem, completion)`` is the answer's
    value."""

    prompt: Callable[..., str]
    facts_hold: Callable[[str, Problem], bool]
    # The answer's value, by which votes count two answers as equal (``Generations``).
    value: Callable[[Problem, str], object]


# The tasks test-time methods run on, by task name.
FORMATS: Registry[TaskFormat] = Registry("test-time task")


@dataclass(frozen=True)
class MethodInput:
    label: tuple[str, int]
    problems: list[Problem]
    budget: int
    gen: Generations
    cfg: TestTimeSettings
    prepared: object = None
    # The task's formats (``FORMATS``; Countdown's unless given); the Countdown-only
    # methods read Countdown's directly.
    fmt: TaskFormat = field(default_factory=lambda: FORMATS.get("countdown"))


@dataclass(frozen=True)
class MethodResult:
    # One dict per problem: problem_id, covered, answered and the method's own fields.
    outcomes: list[dict]
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class MethodSpec:
    run: Callable[[MethodInput], MethodResult]
    # The roles the model must have been built with.
    roles: tuple[str, ...]
    # The smallest budget level that makes sense (selection needs two candidates).
    min_budget: int = 1
    # Whether it needs teacher-forced log-probabilities (an HF scorer).
    needs_scorer: bool = False
    # ``prepare(gen, cfg, calibration_problems) -> state``, run once before every budget.
    prepare: Callable | None = None
    # What one budget level is, for the report.
    unit: str = "samples"
    # The tasks (``FORMATS``) it runs on: the methods that parse Countdown traces, review
    # them or formalise answers run on Countdown only.
    tasks: tuple[str, ...] = ("countdown",)


METHODS: Registry[MethodSpec] = Registry("test-time method")


def register_method(name: str, **spec) -> Callable:
    def decorator(fn: Callable[[MethodInput], MethodResult]):
        METHODS.register(name)(MethodSpec(run=fn, **spec))
        return fn

    return decorator


def prompt(problem: Problem, role: str, **kw) -> str:
    """A Countdown problem's prompt in ``role``."""
    return role_prompt(role, problem.gold["numbers"], problem.gold["target"], **kw)


def vote(gens: list[Gen]) -> Gen | None:
    """The committed answer of several samples: the earliest sample of the most common
    answer value (invalid answers do not vote); the first sample when none is valid."""
    valid = [g for g in gens if g.value is not None]
    if not valid:
        return gens[0] if gens else None
    top = Counter(g.value for g in valid).most_common(1)[0][0]
    return next(g for g in valid if g.value == top)


def mean_or_none(values) -> float | None:
    """The mean of a method statistic's values, None when there are none to average."""
    return float(np.mean(values)) if len(values) else None


def outcome(problem: Problem, outputs: list[Gen], answer: Gen | None, **extra) -> dict:
    return {"problem_id": problem.id, "covered": any(g.correct for g in outputs),
            "answered": bool(answer is not None and answer.correct), **extra}


def _sampling(role: str) -> Callable[[MethodInput], MethodResult]:
    def run(inp: MethodInput) -> MethodResult:
        jobs = [(p, inp.fmt.prompt(p, role)) for p in inp.problems]
        outs = inp.gen.draw(inp.label, role, jobs, inp.budget, inp.cfg.max_tokens)
        return MethodResult([outcome(p, g, vote(g)) for p, g in zip(inp.problems, outs)])

    return run


_ANY_TASK = ("countdown", "knowledge")
register_method("independent", roles=("solve",), tasks=_ANY_TASK)(_sampling("solve"))
register_method("direct", roles=("direct",), tasks=_ANY_TASK)(_sampling("direct"))


def facts_hold(completion: str, target: int) -> bool:
    """Whether a facts line is true: every ``v=a op b`` holds exactly and the first names the
    target (the sub-results may still not be reachable from the given numbers)."""
    words = completion.split("\n", 1)[0].split()
    if not words:
        return False
    for i, word in enumerate(words):
        head, _, rest = word.partition("=")
        m = STEP_RE.fullmatch(f"{rest}={head}") if head.isdigit() else None
        if m is None:
            return False
        a, op, b, v = int(m[1]), m[2], int(m[3]), int(m[4])
        exact = {"+": a + b, "-": a - b, "*": a * b}.get(op)
        if op == "/":
            exact = a // b if b and a % b == 0 else None
        if exact != v or (i == 0 and v != target):
            return False
    return True


@register_method("cpp", roles=("facts",), tasks=_ANY_TASK)
def cpp(inp: MethodInput) -> MethodResult:
    """Concretised propositions: ``facts`` (on Countdown the sub-results the solution
    needs, on knowledge the recalled facts the question needs; then the solution), to be
    read against ``independent`` (solve) and ``direct`` at the same budget. On knowledge it
    tests the source's main claim, that stating the recalled propositions helps compose
    memorised knowledge; on Countdown, which has none, only that it stays competitive on
    maths. Only the abstract of CPP was available; the facts line is the testbed's reading
    of "make the propositions concrete before reasoning", and on knowledge it writes each
    fact in the form the model learnt it, which the setting cannot separate from the
    method."""
    jobs = [(p, inp.fmt.prompt(p, "facts")) for p in inp.problems]
    outs = inp.gen.draw(inp.label, "facts", jobs, inp.budget, inp.cfg.max_tokens)
    rows, held = [], []
    for p, gens in zip(inp.problems, outs):
        for g in gens:
            held.append((inp.fmt.facts_hold(g.text, p), g.correct))
        rows.append(outcome(p, gens, vote(gens)))
    valid = [c for ok, c in held if ok]
    invalid = [c for ok, c in held if not ok]
    return MethodResult(rows, {
        "facts_true_rate": len(valid) / max(len(held), 1),
        "accuracy_when_facts_true": float(np.mean(valid)) if valid else None,
        "accuracy_when_facts_false": float(np.mean(invalid)) if invalid else None})


def _knowledge_prompt(problem: Problem, role: str) -> str:
    return knowledge.render_prompt(problem.gold["question"], role)


FORMATS.register("countdown")(TaskFormat(
    prompt=prompt, facts_hold=lambda text, p: facts_hold(text, p.gold["target"]),
    value=countdown_value))
FORMATS.register("knowledge")(TaskFormat(
    prompt=_knowledge_prompt,
    facts_hold=lambda text, p: knowledge.facts_hold(text, p.gold["question"]),
    value=lambda _, text: knowledge.answer_value(text)))
