"""The one percentile bootstrap over problems, through ``scipy.stats.bootstrap``.

Every interval over problems in the project comes from ``percentile_interval``: pass@k and
accuracy (``passk.bootstrap_ci``), DRG (``difficulty.drg``), the comparison's pass@k bands and
paired differences (``compare.analysis.band``) and the test-time area differences
(``testtime.curves.auc_difference_ci``). Problems are resampled; the samples within a problem
are not, so an interval reflects the choice of problems and treats each per-problem value as
fixed.
"""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
from scipy import stats

# Values gathered per batch of resamples (rows x resamples x problems): a few MB at most.
_BATCH_VALUES = 1 << 20


def percentile_interval(
    sample_F_P,
    statistic: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
    num_resamples: int,
    level: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of ``statistic`` over the P problems of a sample.

    Args:
        sample_F_P: per-problem values, problems on the last axis (P >= 1). Leading rows are
            resampled jointly: each resample draws one set of P problem indices with
            replacement and takes those columns of every row, so paired values (two models'
            scores, a difficulty and an accuracy) stay paired.
        statistic: maps resampled values ``x_F_R_P`` (a batch of R resamples on the
            second-last axis, C-contiguous) to ``stat_..._R`` (resamples last), e.g.
            ``lambda x: x.mean(axis=-1)``, one mean per row and resample. NaN marks a resample where the statistic is undefined; those
            are left out of the percentiles.
        rng: the caller's generator. The resamples are ``rng.integers(0, P, (R, P))``, one
            row per resample in order (drawn in batches, which give the same numbers); P = 1
            draws nothing.
        num_resamples: R >= 1.
        level: two-sided coverage in (0, 1): the ``(1 - level) / 2`` and ``(1 + level) / 2``
            quantiles of the resampled statistic.

    Returns:
        ``(lo, hi)``: arrays of the statistic's shape without the resample axis (0-d for a
        scalar statistic); NaN where every resample is undefined.

    Reference: Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13 (the
    percentile interval). ``scipy.stats.bootstrap(method="percentile")`` draws the resamples
    and evaluates the statistic; the quantiles are those it takes (``scipy.stats.quantile``,
    linear interpolation, Hyndman & Fan type 7), with undefined resamples omitted.

    Raises:
        ValueError: ``num_resamples`` < 1 or ``level`` outside (0, 1).
    """
    sample = np.asarray(sample_F_P, dtype=np.float64)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    if sample.shape[-1] == 1:
        # Every resample of one problem is the sample itself (scipy needs two problems).
        value = np.asarray(statistic(sample[..., None, :]))[..., 0]
        return value, value.copy()

    def contiguous_statistic(x, axis):
        # scipy's gather leaves the problem axis strided when there are several rows; numpy
        # adds pairwise only along a contiguous axis, so without the copy a row's mean would
        # differ in the last bits from the same mean taken over one row alone.
        return statistic(np.ascontiguousarray(x))

    with warnings.catch_warnings():
        # scipy's own interval is NaN (with this warning) when some resample is; such
        # resamples are left out below instead.
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(
            (sample,), contiguous_statistic, n_resamples=num_resamples,
            batch=max(1, _BATCH_VALUES // sample.size), vectorized=True, axis=-1,
            confidence_level=level, method="percentile", rng=rng)
    alpha = (1.0 - level) / 2.0
    lo_hi = stats.quantile(result.bootstrap_distribution, np.array([alpha, 1.0 - alpha]),
                           axis=-1, nan_policy="omit")
    return lo_hi[..., 0], lo_hi[..., 1]
