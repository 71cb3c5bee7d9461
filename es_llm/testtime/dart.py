"""DART: draft agreement routing (Lee et al. 2026), with a calibrated thinking budget.

Two ``direct`` drafts per problem; when they agree the draft is the answer (stage 1, the
router). Otherwise the model thinks (``solve``) under a token budget read from an isotonic
map of draft entropy to the tokens a problem needs (stage 2, the budget), fitted once on
calibration problems apart from the evaluated ones. The source's claims are separate: that
agreement routes well (route rate, agreement precision, routing accuracy) and that the
entropy-calibrated budget saves thinking tokens without cutting the thoughts that would
have succeeded (tokens on drafts and on thinking, the mean budget, the truncated share at
the configured budget and at lower caps), so they are reported separately.

The map is fitted on the calibration problems some solve sample solved, each at its
shortest correct solve: an unsolved problem says nothing about how many tokens solving
needs, and counting it at the cap pulled the map to the cap, so the budget never bound.
"""

from __future__ import annotations

import numpy as np

from es_llm.errors import BadInput
from es_llm.tasks import Problem
from es_llm.testtime.curves import isotonic_fit, isotonic_predict
from es_llm.testtime.generations import Gen, Generations
from es_llm.testtime.methods import (MethodInput, MethodResult, TestTimeSettings,
                                     mean_or_none, outcome, prompt, register_method, vote)


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


def solved_points(entropy: list[float], solves: list[list[Gen]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(draft entropy, tokens of the shortest correct solve) of the calibration problems
    that some solve sample solved; unsolved problems are left out of the fit."""
    pairs = [(h, min(g.num_tokens for g in s if g.correct))
             for h, s in zip(entropy, solves) if any(g.correct for g in s)]
    return (np.array([h for h, _ in pairs], dtype=float),
            np.array([n for _, n in pairs], dtype=float))


def _no_solved_problem(cfg: TestTimeSettings, count: int) -> BadInput:
    return BadInput(
        f"dart has no solved calibration problem to fit its thinking budget on: none of the "
        f"{count} calibration problems was solved by any of its {cfg.calibration_samples} "
        f"solve samples, and an unsolved problem says nothing about the tokens solving "
        f"needs. Give testtime.calibration_data a file of problems this model solves some of "
        f"(e.g. easier tiers), raise testtime.calibration_samples or "
        f"testtime.calibration_problems, or leave dart out of --methods.")


def _dart_calibrate(gen: Generations, cfg: TestTimeSettings, problems: list[Problem]) -> dict:
    """The isotonic map from draft entropy to the tokens a solved calibration problem
    needed; BadInput when no calibration problem is solved."""
    label = ("dart-calibration", 0)
    drafts = gen.draw(label, "draft", [(p, prompt(p, "direct")) for p in problems], 2,
                      cfg.max_tokens, logprobs=True)
    solves = gen.draw(label, "think", [(p, prompt(p, "solve")) for p in problems],
                      cfg.calibration_samples, cfg.max_tokens)
    entropy, needed = solved_points([draft_entropy(d) for d in drafts], solves)
    if not len(needed):
        raise _no_solved_problem(cfg, len(problems))
    knots_x, knots_y = isotonic_fit(entropy, needed)
    cost = sum(sum(gen.cost(label, p.id)) for p in problems)
    return {"knots_entropy": knots_x.tolist(), "knots_tokens": knots_y.tolist(),
            "problems": len(problems), "solved": len(needed), "tokens": cost}


def think_budget(calibration: dict, entropy: float, cfg: TestTimeSettings) -> int:
    """``f(H) * (1 + margin)`` clipped to ``[dart_min_tokens, max_tokens]``."""
    b = isotonic_predict(np.array(calibration["knots_entropy"]),
                         np.array(calibration["knots_tokens"]), entropy)
    return int(min(max(round(b * (1 + cfg.dart_margin)), cfg.dart_min_tokens), cfg.max_tokens))


def truncated_share(thoughts: list[Gen], cap: int | None = None) -> float | None:
    """The share of thinking samples cut by their budget, or that ``cap`` would have cut:
    a sample that ended by itself after n tokens (its end token counted) fits any cap of at
    least n, and one its budget cut is cut by every lower cap too."""
    return mean_or_none([g.finish_reason == "length" or (cap is not None and g.num_tokens > cap)
                         for g in thoughts])


def dart_stats(rows: list[dict], thoughts: list[Gen], caps: tuple[int, ...]) -> dict:
    """Routing (stage 1) and token savings (stage 2), apart. ``rows``: outcomes with
    ``routed``, ``answered``, ``draft_correct``, ``draft_tokens``, ``think_tokens`` and,
    when thought about, ``think_budget``; ``thoughts``: every thinking sample."""
    routed = [r for r in rows if r["routed"]]
    thought = [r for r in rows if not r["routed"]]
    return {
        "route_rate": len(routed) / max(len(rows), 1),
        "agreement_precision": mean_or_none([r["answered"] for r in routed]),
        # Agreement read as a test of "the draft is right": right when it routes a correct
        # draft or sends a wrong one on to thinking.
        "routing_accuracy": mean_or_none([r["routed"] == r["draft_correct"] for r in rows]),
        "draft_tokens_mean": mean_or_none([r["draft_tokens"] for r in rows]),
        "think_tokens_mean": mean_or_none([r["think_tokens"] for r in rows]),
        "mean_think_budget": mean_or_none([r["think_budget"] for r in thought]),
        "thinking_samples": len(thoughts),
        "truncated_share": truncated_share(thoughts),
        "truncated_share_at_cap": {str(c): truncated_share(thoughts, c) for c in caps}}


def _think(inp: MethodInput, budgets: dict[str, int]) -> dict[str, list[Gen]]:
    """``budget`` solve samples of each problem in ``budgets``, one draw per budget value."""
    thoughts: dict[str, list[Gen]] = {}
    for b in sorted(set(budgets.values())):
        todo = [p for p in inp.problems if budgets.get(p.id) == b]
        for p, gens in zip(todo, inp.gen.draw(inp.label, "think",
                                              [(q, prompt(q, "solve")) for q in todo],
                                              inp.budget, b)):
            thoughts[p.id] = gens
    return thoughts


@register_method("dart", roles=("direct", "solve"), prepare=_dart_calibrate,
                 unit="thinking samples")
def dart(inp: MethodInput) -> MethodResult:
    """Two ``direct`` drafts; if they agree, answer; else ``solve`` with a thinking budget
    from the calibrated map of draft entropy, the budget level's number of times, and
    commit to their vote."""
    drafts = inp.gen.draw(inp.label, "draft", [(p, prompt(p, "direct")) for p in inp.problems],
                          2, inp.cfg.max_tokens, logprobs=True)
    budgets = {p.id: think_budget(inp.prepared, draft_entropy(d), inp.cfg)
               for p, d in zip(inp.problems, drafts) if not drafts_agree(d)}
    thoughts = _think(inp, budgets)
    rows = []
    for p, d in zip(inp.problems, drafts):
        t = thoughts.get(p.id, [])
        common = dict(routed=not t, draft_correct=d[0].correct,
                      draft_tokens=sum(g.num_tokens for g in d),
                      think_tokens=sum(g.num_tokens for g in t))
        if t:
            rows.append(outcome(p, d + t, vote(t), think_budget=budgets[p.id],
                                truncated=sum(g.finish_reason == "length" for g in t), **common))
        else:
            rows.append(outcome(p, d, d[0], **common))
    stats = dart_stats(rows, [g for t in thoughts.values() for g in t], inp.cfg.dart_caps)
    return MethodResult(rows, {**stats, "calibration": inp.prepared})
