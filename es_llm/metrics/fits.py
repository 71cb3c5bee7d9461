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
    y), ``residual_sd``, ``n``, and what ``line_band`` needs (``x_mean``, ``sxx``, ``t``).
    The line and its standard errors are ``scipy.stats.linregress``'s.

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
    if np.all(x == x[0]):
        raise ValueError("linear_fit needs x values that are not all equal")
    fit = stats.linregress(x, y)
    constant_y = bool(np.all(y == y[0]))
    # linregress leaves the errors undefined (NaN) for a constant y; the line then fits
    # every point exactly, so they are 0.
    se_slope = 0.0 if constant_y else float(fit.stderr)
    se_intercept = 0.0 if constant_y else float(fit.intercept_stderr)
    t = float(stats.t.ppf(0.5 + level / 2.0, x.size - 2))
    sxx = float(((x - x.mean()) ** 2).sum())
    slope, intercept = float(fit.slope), float(fit.intercept)
    return {
        "slope": slope, "intercept": intercept,
        "slope_ci": [slope - t * se_slope, slope + t * se_slope],
        "intercept_ci": [intercept - t * se_intercept, intercept + t * se_intercept],
        "r2": None if constant_y else float(fit.rvalue) ** 2,
        # se(slope) = s / sqrt(sxx), so the residual standard deviation s is:
        "residual_sd": se_slope * math.sqrt(sxx), "n": int(x.size), "level": level,
        "x_mean": float(x.mean()), "sxx": sxx, "t": t,
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
    """The least-squares slope of a curve (e.g. reward against generated samples,
    ``scipy.stats.linregress``); needs two or more points with x not all equal."""
    x = np.asarray(x_T, dtype=np.float64)
    y = np.asarray(y_T, dtype=np.float64)
    if x.size < 2 or x.size != y.size or np.all(x == x[0]):
        raise ValueError("curve_slope needs two or more points with different x")
    return float(stats.linregress(x, y).slope)
