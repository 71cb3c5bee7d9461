"""Where a model's gains and failures sit on a difficulty scale: pure functions over
per-problem success rates.

- ``drg``: difficulty-aligned reasoning gain. Park, Kim & Kim (KCSAT-ML, arXiv 2606.10403)
  define DRG as a score-orthogonal measure of whether a model's mistakes fall on the items
  humans found hard; their formula is not public. This is the project's reading: the AUROC
  of the difficulty ``e_i`` as a predictor of failure, over ordered pairs (i failed, j
  solved) weighted by ``(1 - acc_i) acc_j`` so several samples per item count, ties 1/2;
  ``DRG = 2 AUC - 1`` in [-1, 1] (+1: fails only on the hardest items, 0: unrelated, -1:
  fails on the easiest). An AUC does not depend on how many items fail, so two models with
  the same ranking of failures have the same DRG at any accuracy.
- ``difficulty_bins`` / ``accuracy_by_bin`` / ``paired_difference_by_bin``: accuracy per
  difficulty bin and the paired gain of one model over another per bin, with bootstrap
  intervals over the bin's problems. With the base model's failure rate ``1 - c_i / n`` as
  the difficulty, gains on base-hard bins are capability, gains on
  base-easy ones sharpening (Yue et al. 2025's question, asked per bin).
- ``rarely_solved_share``: of the problems a model solves, the share the base model solved
  in fewer than 5% of its samples.

Inputs are length-P sequences in one problem order; every function raises ValueError on
mismatched lengths, empty inputs or rates outside [0, 1].
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from es_llm.metrics.bootstrap import percentile_interval
from es_llm.metrics.passk import bootstrap_ci

# Upper edges of the default base-difficulty bins (1 - base success rate): solved almost
# always, mostly, about half the time, rarely, (almost) never.
DEFAULT_EDGES = (0.25, 0.5, 0.75, 0.95)


def _rates(name: str, values_P, size: int | None = None) -> np.ndarray:
    x = np.asarray(values_P, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError(f"{name} is empty")
    if size is not None and x.size != size:
        raise ValueError(f"{name} has {x.size} entries, expected {size} (one per problem)")
    if not np.all(np.isfinite(x)) or x.min() < 0 or x.max() > 1:
        raise ValueError(f"{name} must hold rates in [0, 1]")
    return x


def drg_auc(difficulty_P, accuracy_P) -> float:
    """``P(e_i > e_j | i failed, j solved)`` with pair weights ``(1 - acc_i) acc_j``, ties
    1/2, i != j; NaN when no pair has weight (every item always solved or never)."""
    e = np.asarray(difficulty_P, dtype=np.float64).reshape(-1)
    acc = _rates("accuracy_P", accuracy_P, e.size)
    if not np.all(np.isfinite(e)):
        raise ValueError("difficulty_P must be finite")
    w_P_P = (1.0 - acc)[:, None] * acc[None, :]
    np.fill_diagonal(w_P_P, 0.0)
    total = w_P_P.sum()
    if total <= 0:
        return float("nan")
    above_P_P = (e[:, None] > e[None, :]) + 0.5 * (e[:, None] == e[None, :])
    return float((w_P_P * above_P_P).sum() / total)


def drg(difficulty_P, accuracy_P, rng: np.random.Generator | None = None,
        num_resamples: int = 1000) -> dict:
    """``{"value", "auc", "ci95"}``: DRG = 2 AUC - 1 and, with ``rng``, a 95% percentile
    bootstrap interval over problems (difficulty and accuracy resampled together; resamples
    where DRG is undefined are left out, and ``ci95`` is None when every one is)."""
    auc = drg_auc(difficulty_P, accuracy_P)
    out = {"value": 2 * auc - 1, "auc": auc, "ci95": None}
    if rng is not None and np.isfinite(auc):
        e = np.asarray(difficulty_P, dtype=np.float64).reshape(-1)
        acc = np.asarray(accuracy_P, dtype=np.float64).reshape(-1)
        lo, hi = percentile_interval(np.stack([e, acc]), _resampled_drg, rng, num_resamples,
                                     level=0.95)
        if np.isfinite(lo):
            out["ci95"] = [float(lo), float(hi)]
    return out


def _resampled_drg(x_2_R_P: np.ndarray) -> np.ndarray:
    """DRG of each resample (rows: difficulty, accuracy); NaN where it is undefined."""
    return np.array([2 * drg_auc(e, acc) - 1 for e, acc in zip(x_2_R_P[0], x_2_R_P[1])])


def difficulty_bins(difficulty_P, edges: Sequence[float] = DEFAULT_EDGES) -> np.ndarray:
    """Bin index per problem: bin b holds ``edges[b-1] <= e < edges[b]`` (bin 0 below the
    first edge, the last bin at or above the last edge)."""
    e = np.asarray(difficulty_P, dtype=np.float64).reshape(-1)
    if list(edges) != sorted(edges):
        raise ValueError(f"edges must be increasing, got {list(edges)}")
    return np.searchsorted(np.asarray(edges, dtype=np.float64), e, side="right")


def bin_labels(edges: Sequence[float] = DEFAULT_EDGES) -> list[str]:
    """``["<0.25", "0.25-0.5", ..., ">=0.95"]`` for ``difficulty_bins``' indices."""
    cuts = [f"{x:g}" for x in edges]
    return ([f"<{cuts[0]}"] + [f"{a}-{b}" for a, b in zip(cuts, cuts[1:])]
            + [f">={cuts[-1]}"])


def accuracy_by_bin(bins_P, accuracy_P, num_bins: int) -> list[dict]:
    """``[{"bin", "problems", "accuracy"}]`` per bin (accuracy None in an empty bin)."""
    b = np.asarray(bins_P).reshape(-1)
    acc = _rates("accuracy_P", accuracy_P, b.size)
    return [{"bin": k, "problems": int((b == k).sum()),
             "accuracy": float(acc[b == k].mean()) if (b == k).any() else None}
            for k in range(num_bins)]


def paired_difference_by_bin(bins_P, accuracy_a_P, accuracy_b_P, num_bins: int,
                             rng: np.random.Generator, num_resamples: int = 1000) -> list[dict]:
    """Per bin, mean of ``acc_a - acc_b`` over its problems with a bootstrap interval:
    ``[{"bin", "problems", "difference", "ci95"}]`` (None where the bin is empty)."""
    b = np.asarray(bins_P).reshape(-1)
    d = _rates("accuracy_a_P", accuracy_a_P, b.size) - _rates("accuracy_b_P", accuracy_b_P,
                                                                 b.size)
    out = []
    for k in range(num_bins):
        d_k = d[b == k]
        out.append({"bin": k, "problems": int(d_k.size),
                    "difference": float(d_k.mean()) if d_k.size else None,
                    "ci95": (list(bootstrap_ci(d_k, rng, num_resamples)) if d_k.size
                             else None)})
    return out


def rarely_solved_share(solved_P, base_rate_P, threshold: float = 0.05) -> float | None:
    """Of the problems with ``solved_P`` true, the share whose base success rate is below
    ``threshold``; None when the model solves nothing."""
    s = np.asarray(solved_P, dtype=bool).reshape(-1)
    rate = _rates("base_rate_P", base_rate_P, s.size)
    if not s.any():
        return None
    return float((rate[s] < threshold).mean())
