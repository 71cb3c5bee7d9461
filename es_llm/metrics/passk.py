"""Sampling-based success metrics: pass@k, pass^k, maj@k, and a bootstrap over problems.

Every per-problem function takes ``correct`` as a list over problems of 1-D boolean sequences
(problems may have different sample counts n_i) or as a 2-D boolean array P x N.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from es_llm.metrics.bootstrap import percentile_interval


def as_bool_rows(correct) -> list[np.ndarray]:
    """Normalise ``correct`` to a list of 1-D boolean arrays, one per problem.

    Args:
        correct: a list over problems of 1-D sequences of bools (or 0/1 ints), lengths n_i, or a
            2-D array P x N.

    Returns:
        A list of P arrays ``correct_N`` (dtype bool), one per problem.

    Raises:
        ValueError: a row is not 1-D, or holds values other than booleans / 0 / 1.
    """
    if isinstance(correct, np.ndarray) and correct.ndim != 2:
        raise ValueError(f"correct as an array must be 2-D (P x N), got shape {correct.shape}")
    rows = []
    for p, row in enumerate(correct):
        arr = np.asarray(row)
        if arr.ndim != 1:
            raise ValueError(f"correct[{p}] must be 1-D, got shape {arr.shape}")
        if arr.dtype != bool:
            # Silently casting e.g. rewards like 0.5 to True would inflate every metric.
            if arr.size and not np.all((arr == 0) | (arr == 1)):
                raise ValueError(f"correct[{p}] must hold booleans or 0/1, got {arr[:5]!r}...")
            arr = arr.astype(bool)
        rows.append(arr)
    return rows


def counts_per_problem(correct) -> tuple[np.ndarray, np.ndarray]:
    """Sample and success counts per problem.

    Args:
        correct: list over problems of 1-D bool sequences (lengths n_i), or a P x N bool array.

    Returns:
        ``(n_P, c_P)``: int arrays with the number of samples and of correct samples per problem.
    """
    rows = as_bool_rows(correct)
    n_P = np.array([row.size for row in rows], dtype=np.int64)
    c_P = np.array([int(row.sum()) for row in rows], dtype=np.int64)
    return n_P, c_P


def _check_nck(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    if k > n:
        raise ValueError(f"k must be <= n, got k={k} > n={n}")
    if c < 0 or c > n:
        raise ValueError(f"c must be in [0, n], got c={c}, n={n}")


def _log_ratio_sum(num_minus: int, stop: int, k: int) -> float:
    """sum_{i=num_minus}^{stop} log(1 - k/i) accurately, for integers num_minus > k."""
    i = np.arange(num_minus, stop + 1, dtype=np.float64)
    x = k / i
    # log1p(-x) loses relative accuracy when x is near 1 (1 - x is then mostly rounding error
    # of x), while log((i - k) / i) is exact-ish there because i - k is an exact integer; each
    # form is used where it keeps a few-ulp relative error, so the sum stays accurate.
    terms = np.where(x < 0.5, np.log1p(-np.minimum(x, 0.5)), np.log((i - k) / i))
    return math.fsum(terms.tolist())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one problem: 1 - C(n-c, k) / C(n, k).

    Args:
        n: number of samples drawn for the problem.
        c: number of those samples that are correct.
        k: budget, 1 <= k <= n.

    Returns:
        The probability that at least one of k samples drawn without replacement from the n is
        correct.

    Reference: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (Codex),
    which gives the product form 1 - prod_{i=n-c+1}^{n} (1 - k/i). Departure: the product is
    evaluated as a compensated sum of logs (``math.fsum``) and ``expm1``, so the result has an
    absolute error of a few ulps even for n in the thousands, where the binomials overflow a
    float and a plain product of thousands of factors drifts.

    Raises:
        ValueError: k < 1, k > n, or c outside [0, n].
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    if c == 0:
        return 0.0
    log_fail = _log_ratio_sum(n - c + 1, n, k)
    return float(-math.expm1(log_fail))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k for one problem: C(c, k) / C(n, k), the chance that all k draws are correct.

    Args:
        n: number of samples drawn for the problem.
        c: number of correct samples.
        k: number of draws without replacement, 1 <= k <= n.

    Returns:
        prod_{i=0}^{k-1} (c - i) / (n - i); 0.0 when c < k.

    Reference: Yao et al. 2024, "tau-bench", which defines pass^k with this unbiased estimator.
    The product of k ratios keeps a relative error of about k ulps, and tiny values underflow to
    0.0 rather than overflowing as the binomials would.

    Raises:
        ValueError: k < 1, k > n, or c outside [0, n].
    """
    _check_nck(n, c, k)
    if c < k:
        return 0.0
    i = np.arange(k, dtype=np.float64)
    return float(np.prod((c - i) / (n - i)))


def _per_problem(correct, k: int, estimator) -> np.ndarray:
    n_P, c_P = counts_per_problem(correct)
    for p, n in enumerate(n_P):
        if k > n:
            raise ValueError(f"k={k} exceeds the {n} samples of problem {p}")
    return np.array([estimator(int(n), int(c), k) for n, c in zip(n_P, c_P)], dtype=np.float64)


def pass_at_k_per_problem(correct, k: int) -> np.ndarray:
    """pass@k (``pass_at_k``) of every problem.

    Args:
        correct: list over problems of 1-D bool sequences (lengths n_i >= k), or P x N bools.
        k: budget.

    Returns:
        ``values_P``: float array of per-problem pass@k. Reference: Chen et al. 2021.

    Raises:
        ValueError: some problem has fewer than k samples.
    """
    return _per_problem(correct, k, pass_at_k)


def pass_hat_k_per_problem(correct, k: int) -> np.ndarray:
    """pass^k (``pass_hat_k``) of every problem.

    Args:
        correct: list over problems of 1-D bool sequences (lengths n_i >= k), or P x N bools.
        k: number of draws.

    Returns:
        ``values_P``: float array of per-problem pass^k. Reference: Yao et al. 2024 (tau-bench).

    Raises:
        ValueError: some problem has fewer than k samples.
    """
    return _per_problem(correct, k, pass_hat_k)


def _key_ids(keys: Sequence[str | None]) -> tuple[np.ndarray, int]:
    """Integer id per sample (-1 for None) and the number of distinct non-None keys."""
    index: dict[str, int] = {}
    ids = [-1 if key is None else index.setdefault(key, len(index)) for key in keys]
    return np.array(ids, dtype=np.int64), len(index)


def _majority_scores(counts_S_M: np.ndarray, key_correct_M: np.ndarray) -> np.ndarray:
    """Expected majority-vote score per subset from its vote counts (ties shared, no votes -> 0)."""
    top_S = counts_S_M.max(axis=1)
    tied_S_M = (counts_S_M == top_S[:, None]) & (top_S[:, None] > 0)
    num_tied_S = tied_S_M.sum(axis=1)
    num_tied_correct_S = (tied_S_M & key_correct_M[None, :]).sum(axis=1)
    return np.where(num_tied_S > 0, num_tied_correct_S / np.maximum(num_tied_S, 1), 0.0)


def _subset_vote_counts(subsets_S_k: np.ndarray, ids_N: np.ndarray, num_keys: int) -> np.ndarray:
    """S x M table of votes per key inside each listed subset of sample indices."""
    num_subsets = subsets_S_k.shape[0]
    votes_S_k = ids_N[subsets_S_k]
    rows_S_k = np.broadcast_to(np.arange(num_subsets)[:, None], votes_S_k.shape)
    flat = (rows_S_k * num_keys + votes_S_k)[votes_S_k >= 0]
    return np.bincount(flat, minlength=num_subsets * num_keys).reshape(num_subsets, num_keys)


def _maj_one_problem(
    correct_N: np.ndarray,
    keys: Sequence[str | None],
    k: int,
    rng: np.random.Generator,
    num_subsets: int,
) -> float:
    n = correct_N.size
    ids_N, num_keys = _key_ids(keys)
    key_correct_M = np.zeros(num_keys, dtype=bool)
    key_correct_M[ids_N[correct_N & (ids_N >= 0)]] = True
    if not key_correct_M.any():
        return 0.0
    if k == 1:
        # A one-sample subset elects that sample's key, so the exact value is a plain mean.
        return float(np.mean(np.where(ids_N >= 0, key_correct_M[np.maximum(ids_N, 0)], False)))
    if math.comb(n, k) <= num_subsets:
        subsets_S_k = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64)
        return float(_majority_scores(_subset_vote_counts(subsets_S_k, ids_N, num_keys), key_correct_M).mean())
    # The vote table of a uniform k-subset is multivariate hypergeometric over the key groups
    # (column 0 = the non-voting None group), so it is drawn directly, at O(M) per subset
    # instead of O(n); samples with equal keys are interchangeable for the vote.
    group_sizes = np.bincount(ids_N + 1, minlength=num_keys + 1)
    # Chunked so the S x M table stays a few MB even when every sample has its own key.
    chunk = max(1, (1 << 20) // (num_keys + 1))
    total = 0.0
    for start in range(0, num_subsets, chunk):
        size = min(chunk, num_subsets - start)
        counts_S_M1 = rng.multivariate_hypergeometric(group_sizes, k, size=size)
        total += float(_majority_scores(counts_S_M1[:, 1:], key_correct_M).sum())
    return total / num_subsets


def maj_at_k_per_problem(
    correct,
    answer_keys: Sequence[Sequence[str | None]],
    k: int,
    rng: np.random.Generator,
    num_subsets: int = 1000,
) -> np.ndarray:
    """maj@k of every problem: accuracy of a plurality vote over k samples drawn without replacement.

    Args:
        correct: list over problems of 1-D bool sequences (lengths n_i >= k), or P x N bools.
        answer_keys: list over problems of per-sample canonical answer keys (``str`` or None for
            no parseable answer), same lengths as ``correct``.
        k: subset size.
        rng: seeded generator for the Monte Carlo subsets.
        num_subsets: Monte Carlo subsets per problem; problems with C(n_i, k) <= num_subsets are
            enumerated exactly instead (and k = 1 is always exact), so ``rng`` is then unused.
            A Monte Carlo subset is drawn as its vote table (multivariate hypergeometric over
            the groups of samples sharing a key), which has the same law as drawing indices.

    Returns:
        ``values_P``: float array, the expected score of a uniformly random k-subset per problem.

    Rules inside one subset: every sample with a non-None key casts one vote for its key; the
    key(s) with the most votes win; if no sample votes the subset scores 0; a tie among t keys of
    which s are correct scores s / t, the expectation of breaking the tie uniformly at random
    (no random tie-break is drawn, which removes that source of Monte Carlo noise). A key counts
    as correct if any sample carrying it is graded correct, so a grader that disagrees with
    itself on equal keys cannot make a winning key half-correct.

    Reference: maj@k as in Lewkowycz et al. 2022 (Minerva) and Wang et al. 2023
    (self-consistency). Departure: those report one vote over k drawn samples; this averages over
    all (or many random) k-subsets of the n samples, the same unbiasing idea as pass@k.

    Raises:
        ValueError: mismatched lengths, or some problem has fewer than k samples.
    """
    rows = as_bool_rows(correct)
    if len(answer_keys) != len(rows):
        raise ValueError(f"answer_keys has {len(answer_keys)} problems, correct has {len(rows)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    if num_subsets < 1:
        raise ValueError(f"num_subsets must be >= 1, got {num_subsets}")
    values = []
    for p, (correct_N, keys) in enumerate(zip(rows, answer_keys)):
        if len(keys) != correct_N.size:
            raise ValueError(f"problem {p}: {len(keys)} answer keys but {correct_N.size} samples")
        if k > correct_N.size:
            raise ValueError(f"k={k} exceeds the {correct_N.size} samples of problem {p}")
        values.append(_maj_one_problem(correct_N, keys, k, rng, num_subsets))
    return np.array(values, dtype=np.float64)


def bootstrap_ci(
    values_P,
    rng: np.random.Generator,
    num_resamples: int = 1000,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean over problems.

    Args:
        values_P: per-problem values (e.g. pass@k), length P >= 1, all finite.
        rng: seeded generator for the resamples.
        num_resamples: bootstrap resamples of the P problems (with replacement).
        level: two-sided coverage, e.g. 0.95 gives the 2.5% and 97.5% percentiles.

    Returns:
        ``(lo, hi)`` floats.

    Reference: Efron & Tibshirani 1993, "An Introduction to the Bootstrap", percentile method,
    through ``bootstrap.percentile_interval``. Only problems are resampled, not the samples
    within a problem, so the interval reflects the choice of problems and treats each
    per-problem estimate as fixed.

    Raises:
        ValueError: empty or non-finite values, or a level outside (0, 1).
    """
    values = np.asarray(values_P, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not np.all(np.isfinite(values)):
        raise ValueError("bootstrap_ci needs finite values")
    lo, hi = percentile_interval(values, lambda x_R_P: x_R_P.mean(axis=-1), rng,
                                 num_resamples, level)
    return float(lo), float(hi)


def ks_powers_of_two(n: int) -> list[int]:
    """Budgets at which to report pass@k-style curves: 1, 2, 4, ... <= n, plus n itself.

    Args:
        n: number of samples per problem, >= 1.

    Returns:
        Increasing list of ints; n is appended when it is not a power of two.

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks = [1 << e for e in range(n.bit_length()) if (1 << e) <= n]
    if ks[-1] != n:
        ks.append(n)
    return ks
