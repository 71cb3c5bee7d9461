"""The numbers of a comparison report, as pure functions of aligned sample sets.

Models are grouped into methods by name (``es@0``, ``es@1`` -> method ``es``). A method's
per-problem values are averaged over its training seeds before bootstrapping over problems, so
its confidence intervals describe the choice of problems; the spread across training seeds is
reported beside them (``seed_values``), and neither is passed off as the other.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from es_llm.compare.samples import SampleSet
from es_llm.metrics import (
    accuracy_histogram,
    answer_entropy,
    distinct_correct_solutions,
    diversity_report,
    overlap,
    pass_at_k_per_problem,
    progressions_regressions,
    solved_set,
)
from es_llm.metrics.bootstrap import percentile_interval


def passk_table(correct, ks: list[int]) -> np.ndarray:
    """Per-problem unbiased pass@k (``pass_at_k_per_problem``) for each k: a P x K array."""
    return np.stack([pass_at_k_per_problem(correct, k) for k in ks], axis=1)


@dataclass(frozen=True)
class Resamples:
    """One fixed set of bootstrap resamples of a comparison's P problems.

    Every ``band`` given the same ``Resamples`` (so every ``paired`` difference too) resamples
    the same problems in the same order: each draws from a fresh copy of ``rng``. That keeps
    the bands of every k and of every model, and their paired differences, coherent."""

    num_problems: int
    num_resamples: int
    # A child of the caller's generator, never drawn from itself: only its copies are.
    rng: np.random.Generator


def shared_resamples(num_problems: int, rng: np.random.Generator, num_resamples: int) -> Resamples:
    """``num_resamples`` resamples of ``num_problems`` problems for ``band``, from a child of
    ``rng`` (``Generator.spawn``: the caller's own stream is not advanced, and each call gives
    other resamples)."""
    return Resamples(num_problems, num_resamples, rng.spawn(1)[0])


def band(values_P_K: np.ndarray, resamples: Resamples, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean over problems, for every column.

    Args:
        values_P_K: per-problem values, one column per statistic (e.g. per k).
        resamples: from ``shared_resamples`` for these P problems.
    Returns: ``(lo_K, hi_K)`` from ``metrics.bootstrap.percentile_interval``, every column on
    the same resamples."""
    values_P_K = np.asarray(values_P_K, dtype=np.float64)
    if values_P_K.shape[0] != resamples.num_problems:
        raise ValueError(f"band got {values_P_K.shape[0]} problems, its resamples are of "
                         f"{resamples.num_problems}")
    return percentile_interval(values_P_K.T, lambda x_K_R_P: x_K_R_P.mean(axis=-1),
                               copy.deepcopy(resamples.rng), resamples.num_resamples, level)


def paired(values_a_P: np.ndarray, values_b_P: np.ndarray, resamples: Resamples) -> dict:
    """Mean of a - b over problems with its paired bootstrap 95% interval and a verdict that
    only calls a side ahead when the interval excludes 0."""
    diff_P = np.asarray(values_a_P, float) - np.asarray(values_b_P, float)
    lo, hi = band(diff_P[:, None], resamples)
    lo, hi = float(lo[0]), float(hi[0])
    verdict = "a" if lo > 0 else "b" if hi < 0 else "tie"
    return {"a": float(np.mean(values_a_P)), "b": float(np.mean(values_b_P)),
            "diff": float(diff_P.mean()), "ci95": [lo, hi], "ahead": verdict}


def crossover_k(curve_a_K, curve_b_K, ks: list[int]) -> int | None:
    """The smallest k at which the model behind at k = 1 draws strictly ahead (pass@k curves of
    two models); None when the order at k = 1 never flips or the two tie at k = 1."""
    diff = np.asarray(curve_a_K, float) - np.asarray(curve_b_K, float)
    start = np.sign(diff[0])
    if start == 0:
        return None
    for k, d in zip(ks, diff):
        if np.sign(d) == -start:
            return int(k)
    return None


def _mean_over_seeds(arrays: list[np.ndarray]) -> np.ndarray:
    return np.mean(np.stack(arrays), axis=0)


def model_stats(s: SampleSet, base: SampleSet | None, ks: list[int], rng: np.random.Generator) -> dict:
    """Everything about one model that does not involve another method: pass@k per problem,
    coverage, accuracy histogram, diversity, and progressions/regressions against ``base``
    with the answer entropy on the regressions (confidently wrong or scattered?)."""
    entropy = answer_entropy(s.answer_keys)
    out = {
        "name": s.name, "method": s.method, "seed": s.seed, "source": s.source, "run": s.run,
        "passk_P_K": passk_table(s.correct, ks),
        "solved": sorted(solved_set(s.problem_ids, s.correct)),
        "histogram": accuracy_histogram(s.correct),
        "diversity": diversity_report(s.texts, s.answer_keys, s.solution_keys, s.correct, rng),
        "entropy_P": entropy["entropy_P"],
        "plurality_P": entropy["plurality_share_P"],
        "distinct_correct_P": distinct_correct_solutions(s.solution_keys, s.correct)["counts_P"],
    }
    if base is not None and base.name != s.name:
        pr = progressions_regressions(s.problem_ids, s.correct, base.correct)
        index = {pid: i for i, pid in enumerate(s.problem_ids)}
        reg = [index[pid] for pid in pr["regressions"]]
        pr["regression_entropy"] = float(np.mean(entropy["entropy_P"][reg])) if reg else None
        pr["regression_plurality"] = float(np.mean(entropy["plurality_share_P"][reg])) if reg else None
        # The share of the problems the base never solves that this model solves at least
        # once (zero-hit recovery, LatentRevise's measure on held-out problems).
        unsolved = len(s.problem_ids) - len(solved_set(base.problem_ids, base.correct))
        pr["base_never_solved"] = unsolved
        pr["progression_share"] = pr["num_progressions"] / unsolved if unsolved else None
        out["vs_base"] = pr
    return out


def method_stats(models: list[dict], ks: list[int], resamples: Resamples) -> dict:
    """One method from its seeds' ``model_stats``: seed-averaged curves with bootstrap bands,
    the per-seed values, and seed-averaged coverage, histogram and diversity."""
    passk_P_K = _mean_over_seeds([m["passk_P_K"] for m in models])
    lo, hi = band(passk_P_K, resamples)
    div_keys = ("distinct_answers", "answer_entropy", "plurality_share", "distinct_1",
                "distinct_2", "distinct_3", "self_bleu")
    diversity = {view: {k: _nanmean([m["diversity"][view][k] for m in models]) for k in div_keys}
                 for view in ("all", "correct")}
    diversity["distinct_correct_solutions"] = _nanmean(
        [m["diversity"]["distinct_correct_solutions"] for m in models])
    out = {
        "seeds": [m["seed"] for m in models], "models": [m["name"] for m in models],
        "passk": {"k": ks, "mean": passk_P_K.mean(axis=0).tolist(), "lo": lo.tolist(),
                  "hi": hi.tolist(),
                  "seed_values": {m["name"]: m["passk_P_K"].mean(axis=0).tolist() for m in models}},
        "solved": {"mean": float(np.mean([len(m["solved"]) for m in models])),
                   "seed_values": {m["name"]: len(m["solved"]) for m in models}},
        "histogram": {"labels": models[0]["histogram"]["labels"],
                      "shares": np.mean([m["histogram"]["shares"] for m in models], axis=0).tolist()},
        "diversity": diversity,
    }
    if "vs_base" in models[0]:
        vb = [m["vs_base"] for m in models]
        out["vs_base"] = {
            key: _nanmean([v[key] for v in vb])
            for key in ("num_progressions", "num_regressions", "regression_entropy",
                        "regression_plurality", "progression_share")}
        out["vs_base"]["accuracy_delta"] = _nanmean([v["accuracy_delta"]["mean"] for v in vb])
        out["vs_base"]["seed_values"] = {m["name"]: {k: m["vs_base"][k] for k in (
            "num_progressions", "num_regressions")} for m in models}
    return out


def _nanmean(values) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return float(np.mean(vals)) if vals else None


def pair_stats(a: list[dict], b: list[dict], ks: list[int], problem_ids: tuple,
               resamples: Resamples) -> dict:
    """Method a against method b on the same problems: paired differences (seed-averaged per
    problem) of pass@1, pass@n, answer entropy and distinct correct solutions, the crossover k
    of their pass@k curves, and coverage overlap averaged over all seed pairings."""
    pa = _mean_over_seeds([m["passk_P_K"] for m in a])
    pb = _mean_over_seeds([m["passk_P_K"] for m in b])
    laps = [overlap(set(x["solved"]), set(y["solved"])) for x in a for y in b]
    n_all = len(problem_ids)
    mean_lap = {key: float(np.mean([lap[key] for lap in laps]))
                for key in ("num_only_a", "num_only_b", "num_both")}
    mean_lap["num_neither"] = n_all - sum(mean_lap.values())
    return {
        "a": a[0]["method"], "b": b[0]["method"],
        "pass@1": paired(pa[:, 0], pb[:, 0], resamples),
        f"pass@{ks[-1]}": paired(pa[:, -1], pb[:, -1], resamples),
        "answer_entropy": paired(_mean_over_seeds([m["entropy_P"] for m in a]),
                                 _mean_over_seeds([m["entropy_P"] for m in b]), resamples),
        "distinct_correct": paired(_mean_over_seeds([m["distinct_correct_P"] for m in a]),
                                   _mean_over_seeds([m["distinct_correct_P"] for m in b]),
                                   resamples),
        "crossover_k": crossover_k(pa.mean(axis=0), pb.mean(axis=0), ks),
        "overlap": mean_lap,
    }


def compare_sets(sets: list[SampleSet], base: str, rng: np.random.Generator,
                 num_resamples: int = 1000) -> dict:
    """The comparison of aligned sample sets (``samples.align``) as a JSON-ready dict:
    ``models`` (per model), ``methods`` (seed groups), ``pairs`` (every method against the
    base, then the other methods against each other) and ``settings``."""
    names = [s.name for s in sets]
    if base not in names and base not in {s.method for s in sets}:
        raise ValueError(f"base {base!r} is none of the models {names}")
    base_set = next(s for s in sets if s.name == base or s.method == base)
    n = sets[0].n
    ks = list(range(1, n + 1))
    resamples = shared_resamples(len(sets[0].problem_ids), rng, num_resamples)
    models = {s.name: model_stats(s, base_set, ks, rng) for s in sets}
    by_method: dict[str, list[dict]] = {}
    for m in models.values():
        by_method.setdefault(m["method"], []).append(m)
    methods = {name: method_stats(ms, ks, resamples) for name, ms in by_method.items()}
    order = [base_set.method] + [m for m in by_method if m != base_set.method]
    # (a, b) reads "a - b": every trained method against the reference, then each pair of
    # trained methods in the order given.
    pairs = [(m, order[0]) for m in order[1:]]
    pairs += [(x, y) for i, x in enumerate(order[1:]) for y in order[i + 2:]]
    return {
        "settings": {"n": n, "num_problems": len(sets[0].problem_ids), "base": base_set.method,
                     "bootstrap_resamples": num_resamples,
                     **{k: v for k, v in sets[0].settings.items() if k != "n"}},
        "problem_ids": list(sets[0].problem_ids),
        "models": {name: _public(m) for name, m in models.items()},
        "methods": methods,
        "pairs": [pair_stats(by_method[a], by_method[b], ks, sets[0].problem_ids, resamples)
                  for a, b in pairs],
    }


def _public(m: dict) -> dict:
    """A model's stats without the per-problem arrays (those stay in the samples files)."""
    out = {k: v for k, v in m.items() if not k.endswith("_P") and k != "passk_P_K"}
    out["passk"] = m["passk_P_K"].mean(axis=0).tolist()
    out["num_solved"] = len(m["solved"])
    return out

