"""Test-time strategies as registered functions over one typed input.

A strategy takes a ``MethodInput`` (the problems, its budget level, the ``Generations``
that draw and count everything, the settings, and what its ``prepare`` step computed once
for the run) and returns one outcome per problem: ``covered`` (some output it produced is
correct: the oracle view of the success-vs-tokens curve, ``S(b)`` of metrics.md 5.1) and
``answered`` (the one answer it commits to is correct), plus its own statistics. Its cost is
read from the ledger of ``Generations``, never reported by the method.

The budget level means, per strategy: samples (``independent``, ``direct``, ``cpp``), thinking
samples after a disagreement (``dart``), branches (``ttel``), candidates (``base_select``),
peers (``per``, ``broadcast``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from es_llm.errors import BadInput
from es_llm.tasks import Problem
from es_llm.tasks.countdown_roles import STEP_RE, role_prompt
from es_llm.testtime.curves import isotonic_fit, isotonic_predict
from es_llm.testtime.generations import Gen, Generations
from populations.registry import Registry


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

    def __post_init__(self):
        for name in ("max_tokens", "review_tokens", "plan_tokens", "calibration_problems",
                     "calibration_samples", "dart_min_tokens"):
            if getattr(self, name) < 1:
                raise BadInput(f"testtime.{name} must be at least 1, got {getattr(self, name)}.")
        if not self.temperature > 0:
            raise BadInput(f"testtime.temperature must be > 0 (the methods sample), got "
                           f"{self.temperature}.")
        if not self.dart_margin >= 0:
            raise BadInput(f"testtime.dart_margin must be >= 0, got {self.dart_margin}.")


@dataclass(frozen=True)
class MethodInput:
    label: tuple[str, int]
    problems: list[Problem]
    budget: int
    gen: Generations
    cfg: TestTimeSettings
    prepared: object = None


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


METHODS: Registry[MethodSpec] = Registry("test-time method")


def register_method(name: str, **spec) -> Callable:
    def decorator(fn: Callable[[MethodInput], MethodResult]):
        METHODS.register(name)(MethodSpec(run=fn, **spec))
        return fn

    return decorator


def prompt(problem: Problem, role: str, **kw) -> str:
    return role_prompt(role, problem.gold["numbers"], problem.gold["target"], **kw)


def vote(gens: list[Gen]) -> Gen | None:
    """The committed answer of several samples: the earliest sample of the most common
    answer value (invalid answers do not vote); the first sample when none is valid."""
    valid = [g for g in gens if g.value is not None]
    if not valid:
        return gens[0] if gens else None
    top = Counter(g.value for g in valid).most_common(1)[0][0]
    return next(g for g in valid if g.value == top)


def outcome(problem: Problem, outputs: list[Gen], answer: Gen | None, **extra) -> dict:
    return {"problem_id": problem.id, "covered": any(g.correct for g in outputs),
            "answered": bool(answer is not None and answer.correct), **extra}


def _sampling(role: str) -> Callable[[MethodInput], MethodResult]:
    def run(inp: MethodInput) -> MethodResult:
        jobs = [(p, prompt(p, role)) for p in inp.problems]
        outs = inp.gen.draw(inp.label, role, jobs, inp.budget, inp.cfg.max_tokens)
        return MethodResult([outcome(p, g, vote(g)) for p, g in zip(inp.problems, outs)])

    return run


register_method("independent", roles=("solve",))(_sampling("solve"))
register_method("direct", roles=("direct",))(_sampling("direct"))


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


@register_method("cpp", roles=("facts",))
def cpp(inp: MethodInput) -> MethodResult:
    """Concretised propositions: ``facts`` (the sub-results the solution needs, then the
    solution), to be read against ``independent`` (solve) and ``direct`` at the same budget.
    Only the abstract of CPP was available; the facts line is the testbed's reading of
    "make the propositions concrete before reasoning"."""
    jobs = [(p, prompt(p, "facts")) for p in inp.problems]
    outs = inp.gen.draw(inp.label, "facts", jobs, inp.budget, inp.cfg.max_tokens)
    rows, held = [], []
    for p, gens in zip(inp.problems, outs):
        for g in gens:
            held.append((facts_hold(g.text, p.gold["target"]), g.correct))
        rows.append(outcome(p, gens, vote(gens)))
    valid = [c for ok, c in held if ok]
    invalid = [c for ok, c in held if not ok]
    return MethodResult(rows, {
        "facts_true_rate": len(valid) / max(len(held), 1),
        "accuracy_when_facts_true": float(np.mean(valid)) if valid else None,
        "accuracy_when_facts_false": float(np.mean(invalid)) if invalid else None})


# ---------------------------------------------------------------------------------------------
# DART: draft agreement routing
# ---------------------------------------------------------------------------------------------

def draft_entropy(drafts: list[Gen]) -> float:
    """Mean per-token surprisal of the drafts (``-log p`` of each sampled token, averaged
    per draft, then over drafts): an unbiased estimate of the drafts' mean predictive
    entropy, since the backends return the sampled token's log-probability only. Lee et al.
    (2026) leave "draft entropy" undefined in what was available; this is the project's
    reading."""
    per = [-float(np.mean(g.logprobs)) for g in drafts if g.logprobs]
    return float(np.mean(per)) if per else 0.0


def drafts_agree(drafts: list[Gen]) -> bool:
    """Stage 1 of DART: all drafts give a valid answer of the same value (the task's answer
    equivalence; two correct Countdown answers always agree)."""
    return bool(drafts) and drafts[0].value is not None and all(
        g.value == drafts[0].value for g in drafts)


def _dart_calibrate(gen: Generations, cfg: TestTimeSettings, problems: list[Problem]) -> dict:
    """The isotonic map from draft entropy to the tokens a calibration problem needed (its
    shortest correct solve, or ``max_tokens`` when none of the samples solved it)."""
    label = ("dart-calibration", 0)
    drafts = gen.draw(label, "draft", [(p, prompt(p, "direct")) for p in problems], 2,
                      cfg.max_tokens, logprobs=True)
    solves = gen.draw(label, "think", [(p, prompt(p, "solve")) for p in problems],
                      cfg.calibration_samples, cfg.max_tokens)
    entropy = np.array([draft_entropy(d) for d in drafts])
    needed = np.array([min((g.num_tokens for g in s if g.correct), default=cfg.max_tokens)
                       for s in solves], dtype=float)
    knots_x, knots_y = isotonic_fit(entropy, needed)
    cost = sum(sum(gen.cost(label, p.id)) for p in problems)
    return {"knots_entropy": knots_x.tolist(), "knots_tokens": knots_y.tolist(),
            "problems": len(problems), "tokens": cost}


def think_budget(calibration: dict, entropy: float, cfg: TestTimeSettings) -> int:
    """``f(H) * (1 + margin)`` clipped to ``[dart_min_tokens, max_tokens]``."""
    b = isotonic_predict(np.array(calibration["knots_entropy"]),
                         np.array(calibration["knots_tokens"]), entropy)
    return int(min(max(round(b * (1 + cfg.dart_margin)), cfg.dart_min_tokens), cfg.max_tokens))


@register_method("dart", roles=("direct", "solve"), prepare=_dart_calibrate,
                 unit="thinking samples")
def dart(inp: MethodInput) -> MethodResult:
    """DART (Lee et al. 2026): two ``direct`` drafts; if they agree, answer; else ``solve``
    with a thinking budget from the calibrated isotonic map of draft entropy, the budget
    level's number of times, and commit to their vote."""
    drafts = inp.gen.draw(inp.label, "draft", [(p, prompt(p, "direct")) for p in inp.problems],
                          2, inp.cfg.max_tokens, logprobs=True)
    budgets = {p.id: think_budget(inp.prepared, draft_entropy(d), inp.cfg)
               for p, d in zip(inp.problems, drafts) if not drafts_agree(d)}
    thoughts: dict[str, list[Gen]] = {}
    for b in sorted(set(budgets.values())):
        todo = [p for p in inp.problems if budgets.get(p.id) == b]
        for p, gens in zip(todo, inp.gen.draw(inp.label, "think",
                                              [(q, prompt(q, "solve")) for q in todo],
                                              inp.budget, b)):
            thoughts[p.id] = gens
    rows = []
    for p, d in zip(inp.problems, drafts):
        if p.id in thoughts:
            t = thoughts[p.id]
            rows.append(outcome(p, d + t, vote(t), routed=False, think_budget=budgets[p.id],
                                truncated=sum(g.finish_reason == "length" for g in t)))
        else:
            rows.append(outcome(p, d, d[0], routed=True))
    routed = [r for r in rows if r["routed"]]
    thought = [r for r in rows if not r["routed"]]
    return MethodResult(rows, {
        "route_rate": len(routed) / max(len(rows), 1),
        "agreement_precision": (float(np.mean([r["answered"] for r in routed]))
                                if routed else None),
        "mean_think_budget": (float(np.mean([r["think_budget"] for r in thought]))
                              if thought else None),
        "truncated_thoughts": sum(r["truncated"] for r in thought),
        "calibration": inp.prepared})
