"""Success against generated tokens: isotonic maps, Pareto frontiers, areas, dominance.

Pure functions over arrays. A method run at several budgets gives points (mean tokens per
problem, success rate); its curve ``S(b)`` is the best success any of its points reaches
with at most ``b`` tokens (a step function: a method can always stop early at a smaller
budget). Areas are taken on a log10 token axis over a common range and divided by its
width, so they read as the mean success over that range of budgets.
"""

from __future__ import annotations

import numpy as np


def isotonic_fit(x_N: np.ndarray, y_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-decreasing least-squares fit of ``y`` on ``x`` by pool-adjacent-violators.

    Returns ``(knots_x_K, knots_y_K)``: the distinct sorted x values and the fitted value
    at each (ties in x are pooled first, weighted by their count). DART's budget map (Lee
    et al. 2026) is such a fit from draft entropy to the tokens a problem needed.
    """
    x_N, y_N = np.asarray(x_N, float), np.asarray(y_N, float)
    if x_N.shape != y_N.shape or x_N.ndim != 1 or not len(x_N):
        raise ValueError("isotonic_fit needs two 1-D arrays of the same non-zero length")
    knots_x_K, inverse = np.unique(x_N, return_inverse=True)
    sums = np.bincount(inverse, weights=y_N)
    counts = np.bincount(inverse).astype(float)
    # Blocks of (sum, count, number of knots); merge while a block's mean exceeds the next's.
    blocks: list[list[float]] = []
    for s, c in zip(sums, counts):
        blocks.append([s, c, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s2, c2, k2 = blocks.pop()
            blocks[-1][0] += s2
            blocks[-1][1] += c2
            blocks[-1][2] += k2
    knots_y_K = np.concatenate([np.full(int(k), s / c) for s, c, k in blocks])
    return knots_x_K, knots_y_K


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
    replacement, recomputes every point's mean tokens and success, and both areas over the
    fixed range ``[low, high]``.
    """
    def area(m: str, idx: np.ndarray) -> float:
        return log_auc(np.array([t[idx].mean() for t in tokens_P[m]]),
                       np.array([s[idx].mean() for s in success_P[m]]), low, high)

    num = len(tokens_P[first][0])
    everything = np.arange(num)
    diffs = np.empty(resamples)
    for r in range(resamples):
        idx = rng.integers(0, num, num)
        diffs[r] = area(first, idx) - area(second, idx)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"value": area(first, everything) - area(second, everything),
            "ci95": [float(lo), float(hi)]}
