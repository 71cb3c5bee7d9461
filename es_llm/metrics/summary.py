"""The metrics dict an evaluation writes to metrics.json, and a plain-text table of it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from es_llm.metrics.coverage import accuracy_histogram, share_below, solved_set
from es_llm.metrics.diversity import diversity_report
from es_llm.metrics.passk import (
    as_bool_rows,
    bootstrap_ci,
    ks_powers_of_two,
    maj_at_k_per_problem,
    pass_at_k_per_problem,
    pass_hat_k_per_problem,
)


def json_safe(value):
    """Plain Python types for json.dump; NaN / inf become None since JSON has no NaN."""
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _value_and_ci(values_P: np.ndarray, rng: np.random.Generator, num_resamples: int) -> dict:
    lo, hi = bootstrap_ci(values_P, rng, num_resamples=num_resamples)
    return {"value": float(values_P.mean()), "ci95": [lo, hi]}


def _check_inputs(problem_ids, rows, answer_keys, solution_keys, texts, n, difficulties) -> None:
    num_problems = len(rows)
    if num_problems == 0:
        raise ValueError("evaluation_metrics needs at least one problem")
    lists = {"problem_ids": problem_ids, "answer_keys": answer_keys, "solution_keys": solution_keys, "texts": texts}
    if difficulties is not None:
        lists["difficulties"] = difficulties
    for name, items in lists.items():
        if len(items) != num_problems:
            raise ValueError(f"{name} has {len(items)} problems, correct has {num_problems}")
    for p, row in enumerate(rows):
        if not len(answer_keys[p]) == len(solution_keys[p]) == len(texts[p]) == row.size:
            raise ValueError(f"problem {p}: correct, answer_keys, solution_keys, texts differ in length")
        # Every k up to n must be estimable on every problem, or pass@n would silently mix budgets.
        if row.size < n:
            raise ValueError(f"problem {p} ({problem_ids[p]}) has {row.size} samples, fewer than n={n}")


def _by_difficulty(difficulties: Sequence, pass1_P: np.ndarray, passn_P: np.ndarray) -> dict:
    tiers: dict[str, list[int]] = {}
    for p, tier in enumerate(difficulties):
        tiers.setdefault(str(tier), []).append(p)
    return {
        tier: {
            "pass@1": float(pass1_P[idx].mean()),
            "pass@n": float(passn_P[idx].mean()),
            "num_problems": len(idx),
        }
        for tier, idx in sorted(tiers.items())
    }


def evaluation_metrics(
    problem_ids: Sequence[str],
    correct,
    answer_keys: Sequence[Sequence[str | None]],
    solution_keys: Sequence[Sequence[str | None]],
    texts: Sequence[Sequence[str]],
    n: int,
    rng: np.random.Generator,
    difficulties: Sequence | None = None,
    num_resamples: int = 1000,
    maj_num_subsets: int = 1000,
    self_bleu_max_samples: int = 32,
) -> dict:
    """All headline metrics of one evaluation, as a JSON-serialisable dict.

    Args:
        problem_ids: P unique ids.
        correct: list over problems of 1-D bool sequences (lengths n_i >= n), or P x N bools.
        answer_keys: list over problems of per-sample answer keys (``str`` or None).
        solution_keys: list over problems of per-sample solution keys (``str`` or None).
        texts: list over problems of per-sample completions.
        n: nominal samples per problem; k runs over ``ks_powers_of_two(n)``. Problems with more
            than n samples use all of them in the unbiased estimators.
        rng: seeded generator (bootstrap resamples, maj@k subsets, self-BLEU subsample).
        difficulties: optional tier per problem (any value; keys become ``str``).
        num_resamples: bootstrap resamples per confidence interval.
        maj_num_subsets: Monte Carlo subsets per problem for maj@k.
        self_bleu_max_samples: self-BLEU sample cap per problem.

    Returns:
        ``"pass@k"``, ``"maj@k"``, ``"pass^k"`` for each k -> ``{"value", "ci95": [lo, hi]}``
        (mean over problems, percentile bootstrap over problems); ``"num_problems"``;
        ``"num_samples"`` (= n, per problem) and ``"num_samples_total"``; ``"coverage"``:
        ``{"solved", "share", "solved_ids", "accuracy_histogram", "share_accuracy_below_2pct"}``; ``"diversity"``
        (``diversity_report``); with difficulties, ``"by_difficulty"``: tier ->
        ``{"pass@1", "pass@n", "num_problems"}``. NaN values are written as None.

    References: see ``passk``, ``coverage`` and ``diversity``.

    Raises:
        ValueError: mismatched inputs or a problem with fewer than n samples.
    """
    rows = as_bool_rows(correct)
    _check_inputs(problem_ids, rows, answer_keys, solution_keys, texts, n, difficulties)
    ks = ks_powers_of_two(n)
    metrics: dict = {}
    pass_P_by_k = {}
    for k in ks:
        pass_P_by_k[k] = pass_at_k_per_problem(rows, k)
        metrics[f"pass@{k}"] = _value_and_ci(pass_P_by_k[k], rng, num_resamples)
    for k in ks:
        maj_P = maj_at_k_per_problem(rows, answer_keys, k, rng, num_subsets=maj_num_subsets)
        metrics[f"maj@{k}"] = _value_and_ci(maj_P, rng, num_resamples)
    for k in ks:
        metrics[f"pass^{k}"] = _value_and_ci(pass_hat_k_per_problem(rows, k), rng, num_resamples)
    solved = solved_set(problem_ids, rows)
    metrics["num_problems"] = len(rows)
    metrics["num_samples"] = n
    metrics["num_samples_total"] = int(sum(row.size for row in rows))
    metrics["coverage"] = {
        "solved": len(solved),
        "share": len(solved) / len(rows),
        "solved_ids": sorted(solved),
        "accuracy_histogram": accuracy_histogram(rows),
        # The share of hard problems (per-problem accuracy under 2%): what the testbed's
        # calibration and the "RL narrows coverage" analyses look at.
        "share_accuracy_below_2pct": share_below(rows, 0.02),
    }
    metrics["diversity"] = diversity_report(
        texts, answer_keys, solution_keys, rows, rng, max_samples=self_bleu_max_samples
    )
    if difficulties is not None:
        metrics["by_difficulty"] = _by_difficulty(difficulties, pass_P_by_k[1], pass_P_by_k[n])
    return json_safe(metrics)


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def _ks(metrics: dict, prefix: str) -> list[int]:
    return sorted(int(key[len(prefix):]) for key in metrics
                  if key.startswith(prefix) and key[len(prefix):].isdigit())


def _curve_lines(metrics: dict) -> list[str]:
    """One row per k: pass@k with its interval, then maj@k and pass^k."""
    lines = [f"  {'k':>5}  {'pass@k':>6}  {'95% CI':<16} {'maj@k':>6}  {'pass^k':>6}"]
    for k in _ks(metrics, "pass@"):
        entry = metrics[f"pass@{k}"]
        lo, hi = entry.get("ci95", [None, None])
        maj = metrics.get(f"maj@{k}", {}).get("value")
        hat = metrics.get(f"pass^{k}", {}).get("value")
        lines.append(f"  {k:>5}  {_fmt(entry['value']):>6}  [{_fmt(lo)}, {_fmt(hi)}]   "
                     f"{_fmt(maj):>6}  {_fmt(hat):>6}")
    return lines


def format_table(metrics: dict) -> str:
    """Render the main numbers of an ``evaluation_metrics`` dict as a plain-text table.

    Args:
        metrics: the dict returned by ``evaluation_metrics`` (or read back from metrics.json).

    Returns:
        A multi-line string: pass@k / maj@k / pass^k with 95% intervals, coverage and the
        headline diversity numbers; missing sections are skipped.
    """
    lines = [
        f"problems: {metrics.get('num_problems', '-')}   samples per problem: {metrics.get('num_samples', '-')}",
    ]
    lines.extend(_curve_lines(metrics))
    coverage = metrics.get("coverage")
    if coverage:
        lines.append(f"coverage: {coverage['solved']} solved ({_fmt(coverage['share'])}); "
                     f"share with accuracy < 2%: "
                     f"{_fmt(coverage.get('share_accuracy_below_2pct'))}")
        hist = coverage.get("accuracy_histogram")
        if hist:
            cells = [f"{label}:{count}" for label, count in zip(hist["labels"], hist["counts"])]
            lines.append("  accuracy histogram  " + " ".join(cells))
    diversity = metrics.get("diversity")
    if diversity:
        lines.append(f"  {'diversity':<22} {'all':>7} {'correct':>8}")
        for key in ("distinct_answers", "answer_entropy", "distinct_1", "distinct_2", "distinct_3", "self_bleu"):
            lines.append(
                f"  {key:<22} {_fmt(diversity['all'].get(key)):>7} {_fmt(diversity['correct'].get(key)):>8}"
            )
        lines.append(f"  {'distinct correct sol.':<22} {_fmt(diversity.get('distinct_correct_solutions')):>7}")
    by_difficulty = metrics.get("by_difficulty")
    if by_difficulty:
        lines.append(f"  {'tier':<12} {'pass@1':>7} {'pass@n':>7} {'problems':>9}")
        for tier, row in by_difficulty.items():
            lines.append(f"  {tier:<12} {_fmt(row['pass@1']):>7} {_fmt(row['pass@n']):>7} {row['num_problems']:>9}")
    return "\n".join(lines)
