"""Success against generated tokens: isotonic maps, Pareto frontiers, areas, dominance.

Pure functions over arrays. A method run at several budgets gives points (mean tokens per
problem, success rate); its curve ``S(b)`` is the best success any of its points reaches
with at most ``b`` tokens (a step function: a method can always stop early at a smaller
budget). Areas are taken on a log10 token axis over a common range and divided by its
width, so they read as the mean success over that range of budgets.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression

from es_llm.metrics.bootstrap import percentile_interval


def isotonic_fit(x_N: np.ndarray, y_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-decreasing least-squares fit of ``y`` on ``x`` (pool-adjacent-violators,
    ``scipy.optimize.isotonic_regression``).

    Returns ``(knots_x_K, knots_y_K)``: the distinct sorted x values and the fitted value
    at each (ties in x are pooled first: their mean y, weighted by their count). DART's
    budget map (Lee et al. 2026) is such a fit from draft entropy to the tokens a problem
    needed.
    """
    x_N, y_N = np.asarray(x_N, float), np.asarray(y_N, float)
    if x_N.shape != y_N.shape or x_N.ndim != 1 or not len(x_N):
        raise ValueError("isotonic_fit needs two 1-D arrays of the same non-zero length")
    knots_x_K, inverse = np.unique(x_N, return_inverse=True)
    counts_K = np.bincount(inverse).astype(float)
    means_K = np.bincount(inverse, weights=y_N) / counts_K
    return knots_x_K, isotonic_regression(means_K, weights=counts_K).x


def isotonic_predict(knots_x_K: np.ndarray, knots_y_K: np.ndarray, x: float) -> float:
    """The fitted map at ``x``: linear between knots, constant beyond the end knots."""
    return float(np.interp(x, knots_x_K, knots_y_K))


def step_curve(tokens_P: np.ndarray, success_P: np.ndarray, b: float) -> float:
    """``S(b)``: the best success among the points that cost at most ``b`` tokens (0 when
    none does)."""
    ok = np.asarray(tokens_P, float) <= b
    return float(np.max(np.asarray(success_P, float)[ok])) if ok.any() else 0.0


def pareto_front(points: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """The points ``(label, tokens, success)`` no other point beats: none cheaper or as cheap
    with higher success. Sorted by tokens."""
    front, best = [], -np.inf
    for label, tokens, success in sorted(points, key=lambda p: (p[1], -p[2])):
        if success > best:
            front.append((label, tokens, success))
            best = success
    return front


def log_auc(tokens_P: np.ndarray, success_P: np.ndarray, low: float, high: float) -> float:
    """The mean of ``S(b)`` over ``log10 b`` in ``[low, high]`` (exact for the step curve)."""
    if not 0 < low < high:
        raise ValueError(f"log_auc needs 0 < low < high, got {low}, {high}")
    edges = np.unique(np.clip(np.concatenate([[low, high], np.asarray(tokens_P, float)]),
                              low, high))
    logs = np.log10(edges)
    area = sum(step_curve(tokens_P, success_P, b) * (l1 - l0)
               for b, l0, l1 in zip(edges[:-1], logs[:-1], logs[1:]))
    return float(area / (np.log10(high) - np.log10(low)))


def dominates(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
              low: float, high: float) -> bool:
    """Whether curve ``a`` is at least curve ``b`` at every budget in ``[low, high]`` and
    above it somewhere (curves given as ``(tokens_P, success_P)``)."""
    grid = np.unique(np.clip(np.concatenate([[low, high], a[0], b[0]]), low, high))
    sa = np.array([step_curve(*a, g) for g in grid])
    sb = np.array([step_curve(*b, g) for g in grid])
    return bool(np.all(sa >= sb) and np.any(sa > sb))


def auc_difference_ci(tokens_P: dict, success_P: dict, first: str, second: str, low: float,
                      high: float, rng: np.random.Generator, resamples: int = 1000
                      ) -> dict:
    """The area difference of method ``first`` minus ``second`` with a paired 95% bootstrap
    interval over problems.

    ``tokens_P[m]`` / ``success_P[m]``: one array per budget level of method m, each of
    shape [P] over the same problems in the same order. Each resample draws P problems with
    replacement (the same ones for every array), recomputes every point's mean tokens and
    success, and both areas over the fixed range ``[low, high]``.
    """
    # Rows: first's tokens at each level, its success at each level, then second's.
    rows_F_P = np.array([row for m in (first, second) for row in (*tokens_P[m], *success_P[m])],
                        dtype=float)

    def area_R(means_2L_R: np.ndarray) -> np.ndarray:
        tokens_L_R, success_L_R = np.split(means_2L_R, 2)
        return np.array([log_auc(t_L, s_L, low, high)
                         for t_L, s_L in zip(tokens_L_R.T, success_L_R.T)])

    def difference(x_F_R_P: np.ndarray) -> np.ndarray:
        first_2L_R, second_2L_R = np.split(x_F_R_P.mean(axis=-1), [2 * len(tokens_P[first])])
        return area_R(first_2L_R) - area_R(second_2L_R)

    lo, hi = percentile_interval(rows_F_P, difference, rng, resamples, level=0.95)
    return {"value": float(difference(rows_F_P[:, None, :])[0]),
            "ci95": [float(lo), float(hi)]}
