"""Where on a difficulty scale each method gains: the "difficulty" section of a comparison.

Two difficulty signals per problem: the reference model's failure rate ``1 - c_i / n`` on the
compared samples (base difficulty), and the problem's tier (``difficulty`` field of the
problem file, e.g. the number of Countdown numbers), or a per-item column of a file the user
gives (``--difficulty-file``, e.g. human error rates). For every method (seed means of
per-problem accuracy ``c_i / n``):

- DRG against each signal (``es_llm.metrics.difficulty``; not against base difficulty for
  the reference itself, whose failures define it);
- accuracy per base-difficulty bin and per tier, and the paired difference to the reference
  with bootstrap intervals over the bin's problems;
- the share of the problems it solves in any of its n samples that the reference solved in
  fewer than 5% of its own (per training seed, then averaged).

A gain on base-hard bins is capability the reference lacked; a gain on base-easy bins only is
sharpening.
"""

from __future__ import annotations

import numpy as np

from es_llm.compare.samples import SampleSet
from es_llm.metrics.difficulty import (DEFAULT_EDGES, accuracy_by_bin, bin_labels,
                                       difficulty_bins, drg, paired_difference_by_bin,
                                       rarely_solved_share)
from populations.numbers import is_finite_number


def _accuracy_P(sets: list[SampleSet]) -> np.ndarray:
    """Seed-mean per-problem accuracy ``c_i / n``."""
    return np.mean([[float(np.mean(c)) for c in s.correct] for s in sets], axis=0)


def _rarely_solved(sets: list[SampleSet], ref_P: np.ndarray) -> float | None:
    """``rarely_solved_share`` of each seed's own samples (so a method with more seeds does
    not get more tries), averaged over the seeds that solve anything."""
    shares = [rarely_solved_share([bool(np.any(c)) for c in s.correct], ref_P) for s in sets]
    shares = [x for x in shares if x is not None]
    return float(np.mean(shares)) if shares else None


def _tiers(sets: list[SampleSet]) -> list | None:
    tiers = list(sets[0].difficulties)
    return tiers if all(t is not None for t in tiers) else None


def _by_group(groups_P: np.ndarray, labels: list, acc_P, ref_P, rng, num_resamples) -> list:
    rows = accuracy_by_bin(groups_P, acc_P, len(labels))
    diffs = paired_difference_by_bin(groups_P, acc_P, ref_P, len(labels), rng, num_resamples)
    return [{"label": str(label), "problems": r["problems"], "accuracy": r["accuracy"],
             "difference": d["difference"], "ci95": d["ci95"]}
            for label, r, d in zip(labels, rows, diffs)]


def difficulty(sets: list[SampleSet], reference: str, rng: np.random.Generator,
               num_resamples: int = 1000, item_difficulty: dict | None = None,
               edges=DEFAULT_EDGES) -> dict:
    """The difficulty section as a JSON-ready dict.

    Args:
        sets: aligned sample sets of every model (``samples.align``).
        reference: the method the others are measured against; its failure rate is the
            base difficulty.
        item_difficulty: ``{"name", "values": {problem id: difficulty}}`` from a file, or
            None; every compared problem must have a value (checked by the caller).
    Returns: ``{"reference", "edges", "bins", "signals", "methods": {method: {"drg":
        {signal: {value, auc, ci95} | None}, "rarely_solved_share", "by_bin": [...],
        "by_tier": [...] | None}}}``.
    """
    methods: dict[str, list[SampleSet]] = {}
    for s in sets:
        methods.setdefault(s.method, []).append(s)
    ref = reference.split("@")[0]
    ref_P = _accuracy_P(methods[ref])
    base_P = 1.0 - ref_P
    bins_P = difficulty_bins(base_P, edges)
    labels = bin_labels(edges)
    tiers = _tiers(sets)
    signals = {"base": base_P}
    if tiers is not None and all(is_finite_number(t) for t in tiers):
        signals["tier"] = np.asarray(tiers, dtype=np.float64)
    if item_difficulty is not None:
        signals[item_difficulty["name"]] = np.array(
            [float(item_difficulty["values"][pid]) for pid in sets[0].problem_ids])
    numeric = "tier" in signals
    tier_names = sorted(set(tiers), key=None if numeric else str) if tiers is not None else []
    tier_P = np.array([tier_names.index(t) for t in tiers]) if tiers is not None else None
    out = {}
    for method, mine in methods.items():
        acc_P = _accuracy_P(mine)
        out[method] = {
            "drg": {name: (None if name == "base" and method == ref else
                           drg(values, acc_P, rng, num_resamples))
                    for name, values in signals.items()},
            "rarely_solved_share": _rarely_solved(mine, ref_P),
            "by_bin": _by_group(bins_P, labels, acc_P, ref_P, rng, num_resamples),
            "by_tier": (_by_group(tier_P, tier_names, acc_P, ref_P, rng, num_resamples)
                        if tier_P is not None else None)}
    return {"reference": reference, "edges": list(edges), "bins": labels,
            "signals": list(signals), "methods": out}
