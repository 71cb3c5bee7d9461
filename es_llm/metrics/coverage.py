"""Which problems a model can solve at all, and how that set moves against a reference model.

"Solved" means solved by at least one sample (coverage, i.e. pass@n with the samples drawn).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from es_llm.metrics.passk import as_bool_rows, counts_per_problem


def _check_ids(problem_ids: Sequence[str], num_rows: int) -> None:
    if len(problem_ids) != num_rows:
        raise ValueError(f"{len(problem_ids)} problem ids but {num_rows} problems of results")
    if len(set(problem_ids)) != len(problem_ids):
        # A duplicate id would merge two problems into one set element and skew every count.
        raise ValueError("problem_ids must be unique")


def solved_set(problem_ids: Sequence[str], correct) -> set[str]:
    """Ids of the problems solved by at least one sample.

    Args:
        problem_ids: P unique problem ids.
        correct: list over problems of 1-D bool sequences (lengths n_i), or P x N bools.

    Returns:
        The set of solved ids (coverage in the sense of Brown et al. 2024, "Large Language
        Monkeys").

    Raises:
        ValueError: length mismatch or duplicate ids.
    """
    rows = as_bool_rows(correct)
    _check_ids(problem_ids, len(rows))
    return {pid for pid, row in zip(problem_ids, rows) if row.any()}


def overlap(solved_a: set[str], solved_b: set[str]) -> dict:
    """Compare two solved sets.

    Args:
        solved_a: ids solved by system A.
        solved_b: ids solved by system B.

    Returns:
        A JSON-ready dict: ``both``, ``only_a``, ``only_b`` (sorted id lists), ``num_a``,
        ``num_b``, ``num_both``, ``num_only_a``, ``num_only_b``, ``num_union`` and ``jaccard``
        = |A & B| / |A | B|. Two empty sets have Jaccard 1.0 (they are identical), not NaN, so
        the value stays valid JSON.
    """
    both = sorted(solved_a & solved_b)
    only_a = sorted(solved_a - solved_b)
    only_b = sorted(solved_b - solved_a)
    num_union = len(both) + len(only_a) + len(only_b)
    return {
        "both": both,
        "only_a": only_a,
        "only_b": only_b,
        "num_a": len(solved_a),
        "num_b": len(solved_b),
        "num_both": len(both),
        "num_only_a": len(only_a),
        "num_only_b": len(only_b),
        "num_union": num_union,
        "jaccard": len(both) / num_union if num_union else 1.0,
    }


def progressions_regressions(problem_ids: Sequence[str], correct_model, correct_reference) -> dict:
    """Problems a trained model gains or loses against a reference (e.g. its base model).

    Args:
        problem_ids: P unique problem ids, in the order of both result lists.
        correct_model: list over problems of 1-D bool sequences for the model (lengths n_i).
        correct_reference: the same for the reference (lengths m_i, may differ from n_i).

    Returns:
        A JSON-ready dict:
        ``progressions``: sorted ids the reference never solves and the model solves at least
        once; ``regressions``: sorted ids the reference solves at least once and the model never;
        ``num_progressions``, ``num_regressions``; and ``accuracy_delta`` with ``mean`` (mean over
        problems of model accuracy c/n minus reference accuracy), ``num_up``, ``num_down`` and
        ``num_same`` (problems whose per-problem accuracy rose, fell, or stayed equal).

    Reference: the progression/regression split follows the "solved at least once" coverage
    comparison of Yue et al. 2025 ("Does Reinforcement Learning Really Incentivize Reasoning
    Capacity in LLMs Beyond the Base Model?").

    Raises:
        ValueError: length mismatch, duplicate ids, or a problem with no samples.
    """
    n_model_P, c_model_P = counts_per_problem(correct_model)
    n_ref_P, c_ref_P = counts_per_problem(correct_reference)
    _check_ids(problem_ids, n_model_P.size)
    _check_ids(problem_ids, n_ref_P.size)
    if np.any(n_model_P == 0) or np.any(n_ref_P == 0):
        raise ValueError("every problem needs at least one sample in both results")
    model_solves = c_model_P > 0
    ref_solves = c_ref_P > 0
    progressions = sorted(pid for pid, m, r in zip(problem_ids, model_solves, ref_solves) if m and not r)
    regressions = sorted(pid for pid, m, r in zip(problem_ids, model_solves, ref_solves) if r and not m)
    # Cross-multiplying keeps the rose/fell/same decision exact when n differs between runs.
    diff_P = c_model_P * n_ref_P - c_ref_P * n_model_P
    delta_P = c_model_P / n_model_P - c_ref_P / n_ref_P
    return {
        "progressions": progressions,
        "regressions": regressions,
        "num_progressions": len(progressions),
        "num_regressions": len(regressions),
        "accuracy_delta": {
            "mean": float(delta_P.mean()) if delta_P.size else 0.0,
            "num_up": int(np.sum(diff_P > 0)),
            "num_down": int(np.sum(diff_P < 0)),
            "num_same": int(np.sum(diff_P == 0)),
        },
    }


def accuracy_histogram(correct, num_bins: int = 10) -> dict:
    """Histogram of per-problem accuracy c_i / n_i.

    Args:
        correct: list over problems of 1-D bool sequences (lengths n_i >= 1), or P x N bools.
        num_bins: number of equal-width right-closed bins over (0, 1].

    Returns:
        A JSON-ready dict: ``labels`` (``"0"`` then ``"(a,b]"``), ``edges`` (num_bins + 1 floats
        from 0 to 1), ``counts`` and ``shares`` (num_bins + 1 entries, the first for accuracy
        exactly 0), ``num_problems`` and ``share_unsolved`` (= the first share). Unsolved problems
        get their own bin because "never solved" is qualitatively different from "rarely solved";
        with P = 0 all shares are 0.0.

    Raises:
        ValueError: num_bins < 1 or a problem with no samples.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    n_P, c_P = counts_per_problem(correct)
    if np.any(n_P == 0):
        raise ValueError("every problem needs at least one sample")
    # Integer ceil(c * B / n) places e.g. 3/10 in (0.2, 0.3] exactly; float 0.3 * 10 would not.
    bin_P = np.where(c_P == 0, 0, -(-(c_P * num_bins) // np.maximum(n_P, 1)))
    counts = np.bincount(bin_P, minlength=num_bins + 1).astype(int)
    num_problems = int(n_P.size)
    shares = counts / num_problems if num_problems else np.zeros(num_bins + 1)
    edges = [j / num_bins for j in range(num_bins + 1)]
    labels = ["0"] + [f"({edges[j]:g},{edges[j + 1]:g}]" for j in range(num_bins)]
    return {
        "labels": labels,
        "edges": edges,
        "counts": counts.tolist(),
        "shares": [float(s) for s in shares],
        "num_problems": num_problems,
        "share_unsolved": float(shares[0]),
    }


def share_below(correct, threshold: float) -> float:
    """Share of problems whose empirical accuracy c_i / n_i (the pass@1 estimate) is < threshold.

    Args:
        correct: list over problems of 1-D bool sequences (lengths n_i >= 1), or P x N bools.
        threshold: strict upper bound, e.g. 0.02 for "pass@1 below 2%".

    Returns:
        A float in [0, 1]; 0.0 for P = 0.

    Raises:
        ValueError: a problem with no samples.
    """
    n_P, c_P = counts_per_problem(correct)
    if np.any(n_P == 0):
        raise ValueError("every problem needs at least one sample")
    if n_P.size == 0:
        return 0.0
    return float(np.mean(c_P / n_P < threshold))
