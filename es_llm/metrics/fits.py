"""Straight-line fits with confidence intervals: pure functions over arrays.

Used by the pretraining-to-post-training study (``scripts/scaling_study.py``): post-training
accuracy against pretraining loss, and the slope of a reward curve against pretraining
tokens, each fitted across the builds of a grid.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def linear_fit(x_N, y_N, level: float = 0.95) -> dict:
    """Ordinary least squares ``y = intercept + slope x`` with two-sided ``level`` intervals.

    Args:
        x_N, y_N: N paired finite values, N >= 3, x not all equal.
        level: coverage of the intervals.

    Returns a JSON-ready dict: ``slope``, ``intercept``, their intervals ``slope_ci`` and
    ``intercept_ci`` (Student t with N - 2 degrees of freedom on the usual standard errors,
    e.g. Draper & Smith, "Applied Regression Analysis", ch. 1), ``r2`` (None for a constant
    y), ``residual_sd``,
    ``n``, and what ``line_band`` needs (``x_mean``, ``sxx``, ``t``).

    Raises ValueError for fewer than 3 points, unequal lengths, non-finite values or a
    constant x (the slope is then undefined).
    """
    x = np.asarray(x_N, dtype=np.float64).reshape(-1)
    y = np.asarray(y_N, dtype=np.float64).reshape(-1)
    if x.size != y.size:
        raise ValueError(f"linear_fit needs paired values, got {x.size} x and {y.size} y")
    if x.size < 3:
        raise ValueError(f"linear_fit needs at least 3 points for an interval, got {x.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("linear_fit needs finite values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    n = x.size
    x_mean, y_mean = x.mean(), y.mean()
    sxx = float(((x - x_mean) ** 2).sum())
    if sxx == 0.0:
        raise ValueError("linear_fit needs x values that are not all equal")
    slope = float(((x - x_mean) * (y - y_mean)).sum() / sxx)
    intercept = float(y_mean - slope * x_mean)
    residuals = y - (intercept + slope * x)
    sse = float((residuals ** 2).sum())
    sst = float(((y - y_mean) ** 2).sum())
    s2 = sse / (n - 2)
    t = float(stats.t.ppf(0.5 + level / 2.0, n - 2))
    se_slope = math.sqrt(s2 / sxx)
    se_intercept = math.sqrt(s2 * (1.0 / n + x_mean ** 2 / sxx))
    return {
        "slope": slope, "intercept": intercept,
        "slope_ci": [slope - t * se_slope, slope + t * se_slope],
        "intercept_ci": [intercept - t * se_intercept, intercept + t * se_intercept],
        # None when y is constant (no variance to explain).
        "r2": 1.0 - sse / sst if sst > 0 else None,
        "residual_sd": math.sqrt(s2), "n": n, "level": level,
        "x_mean": float(x_mean), "sxx": sxx, "t": t,
    }


def line_band(fit: dict, x_M) -> tuple[np.ndarray, np.ndarray]:
    """The ``fit``'s confidence band of the mean response at the points ``x_M``:
    ``yhat +- t s sqrt(1/n + (x - x_mean)^2 / sxx)``; returns ``(lo_M, hi_M)``."""
    x = np.asarray(x_M, dtype=np.float64)
    yhat = fit["intercept"] + fit["slope"] * x
    half = fit["t"] * fit["residual_sd"] * np.sqrt(1.0 / fit["n"]
                                                   + (x - fit["x_mean"]) ** 2 / fit["sxx"])
    return yhat - half, yhat + half


def curve_slope(x_T, y_T) -> float:
    """The least-squares slope of a curve (e.g. reward against generated samples); needs two
    or more points with x not all equal."""
    x = np.asarray(x_T, dtype=np.float64)
    y = np.asarray(y_T, dtype=np.float64)
    if x.size < 2 or x.size != y.size or np.all(x == x[0]):
        raise ValueError("curve_slope needs two or more points with different x")
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc ** 2).sum())
