"""The one percentile bootstrap: it draws the resamples the hand-written loops it replaced drew
(the same indices in the same order from the same generator), its intervals equal theirs to
rounding, and its 95% interval of a known mean covers that mean about 95% of the time."""

from __future__ import annotations

import numpy as np
import pytest

from es_llm.metrics.bootstrap import percentile_interval
from es_llm.metrics.difficulty import drg, drg_auc
from es_llm.metrics.passk import bootstrap_ci
from es_llm.testtime.curves import auc_difference_ci, log_auc

# The resampled statistics are bitwise those of the loops; only the last step differs:
# scipy.stats.quantile interpolates as (1 - g) y_j + g y_j+1, numpy's quantile as
# y_j + g (y_j+1 - y_j), and the two round apart by a few units in the last place.
RTOL = 1e-14


def reference_interval(sample_F_P, statistic_one, rng, num_resamples, level):
    """The loop the project used to write by hand: one row of P indices per resample, the
    statistic of those columns, undefined (NaN) resamples dropped, numpy's quantiles."""
    sample = np.atleast_2d(np.asarray(sample_F_P, dtype=float))
    draws = []
    for _ in range(num_resamples):
        idx = rng.integers(0, sample.shape[-1], sample.shape[-1])
        draws.append(statistic_one(sample[:, idx]))
    draws = np.array(draws)
    alpha = (1.0 - level) / 2.0
    return np.quantile(draws[np.isfinite(draws)], [alpha, 1.0 - alpha])


def paired_difference(x_2_R_P):
    return x_2_R_P[0].mean(axis=-1) - x_2_R_P[1].mean(axis=-1)


@pytest.mark.parametrize("num_problems, num_resamples, level", [
    (400, 1000, 0.95), (37, 999, 0.9), (2, 200, 0.5), (3000, 300, 0.95)])
def test_the_mean_interval_is_the_reference_loops(num_problems, num_resamples, level):
    values = np.random.default_rng(num_problems).random(num_problems)
    mine, theirs = np.random.default_rng(7), np.random.default_rng(7)
    lo, hi = percentile_interval(values, lambda x: x.mean(axis=-1), mine, num_resamples, level)
    ref = reference_interval(values, lambda x: x[0].mean(), theirs, num_resamples, level)
    np.testing.assert_allclose([lo, hi], ref, rtol=RTOL, atol=0)
    # The same draws, so both generators end in the same state.
    assert mine.bit_generator.state == theirs.bit_generator.state
    assert bootstrap_ci(values, np.random.default_rng(7), num_resamples, level) == (lo, hi)


def test_rows_are_resampled_together_so_a_paired_difference_stays_paired():
    gen = np.random.default_rng(0)
    a_P = (gen.random(300) < 0.4).astype(float)
    b_P = np.where(gen.random(300) < 0.9, a_P, 1 - a_P)  # b agrees with a on ~90%
    sample = np.stack([a_P, b_P])
    lo, hi = percentile_interval(sample, paired_difference, np.random.default_rng(1), 1000, 0.95)
    ref = reference_interval(sample, lambda x: x[0].mean() - x[1].mean(),
                             np.random.default_rng(1), 1000, 0.95)
    np.testing.assert_allclose([lo, hi], ref, rtol=RTOL, atol=0)
    # Resampling the two models apart would ignore their agreement: a far wider interval.
    apart = np.stack([a_P, b_P[np.random.default_rng(2).permutation(300)]])
    lo_apart, hi_apart = percentile_interval(apart, paired_difference, np.random.default_rng(1),
                                             1000, 0.95)
    assert (hi - lo) < 0.5 * (hi_apart - lo_apart)


def test_several_columns_share_the_resamples_of_one():
    values_K_P = np.random.default_rng(3).random((3, 200))
    lo_K, hi_K = percentile_interval(values_K_P, lambda x: x.mean(axis=-1),
                                     np.random.default_rng(5), 500, 0.95)
    for k in range(3):
        assert (lo_K[k], hi_K[k]) == bootstrap_ci(values_K_P[k], np.random.default_rng(5), 500)


def test_undefined_resamples_are_left_out():
    # The statistic is undefined on resamples that miss problem 0 (about (1 - 1/P)^P of them).
    values = np.random.default_rng(4).random(5)

    def mean_if_first(x_R_P):
        drawn = x_R_P == values[0]
        return np.where(drawn.any(axis=-1), x_R_P.mean(axis=-1), np.nan)

    lo, hi = percentile_interval(values, mean_if_first, np.random.default_rng(6), 400, 0.95)
    ref = reference_interval(values, lambda x: x.mean() if (x == values[0]).any() else np.nan,
                             np.random.default_rng(6), 400, 0.95)
    np.testing.assert_allclose([lo, hi], ref, rtol=RTOL, atol=0)
    never = percentile_interval(values, lambda x: np.full(x.shape[:-1], np.nan),
                                np.random.default_rng(6), 50, 0.95)
    assert np.isnan(never).all()


def test_one_problem_is_its_own_interval_and_draws_nothing():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert percentile_interval([0.3], lambda x: x.mean(axis=-1), rng, 100, 0.95) == (0.3, 0.3)
    assert rng.bit_generator.state == before
    with pytest.raises(ValueError, match="level"):
        percentile_interval([0.1, 0.2], lambda x: x.mean(axis=-1), rng, 10, 1.0)
    with pytest.raises(ValueError, match="num_resamples"):
        percentile_interval([0.1, 0.2], lambda x: x.mean(axis=-1), rng, 0, 0.95)


def test_drg_interval_is_its_reference_loop():
    gen = np.random.default_rng(2)
    for num_problems in (400, 12):
        e = gen.random(num_problems)
        acc = (gen.binomial(16, 1 - e) / 16 if num_problems > 12
               else (gen.random(num_problems) < 0.1).astype(float))  # some resamples undefined
        out = drg(e, acc, np.random.default_rng(3), 300)
        ref = reference_interval(np.stack([e, acc]), lambda x: 2 * drg_auc(x[0], x[1]) - 1,
                                 np.random.default_rng(3), 300, 0.95)
        np.testing.assert_allclose(out["ci95"], ref, rtol=RTOL, atol=0)


def test_area_difference_interval_is_its_reference_loop():
    gen = np.random.default_rng(5)
    num = 150
    tokens = {m: [gen.integers(50, 3000, num) * (level + 1.0) for level in range(3)]
              for m in ("a", "b")}
    success = {m: [(gen.random(num) < 0.2 + 0.2 * level).astype(float) for level in range(3)]
               for m in ("a", "b")}
    low, high = 60.0, 4000.0
    out = auc_difference_ci(tokens, success, "a", "b", low, high, np.random.default_rng(8), 200)

    def area(m, x):  # x: the resampled rows, in the order a's tokens, a's success, b's ...
        rows = x[:6] if m == "a" else x[6:]
        return log_auc(rows[:3].mean(axis=-1), rows[3:].mean(axis=-1), low, high)

    sample = np.array([*tokens["a"], *success["a"], *tokens["b"], *success["b"]])
    ref = reference_interval(sample, lambda x: area("a", x) - area("b", x),
                             np.random.default_rng(8), 200, 0.95)
    np.testing.assert_allclose(out["ci95"], ref, rtol=RTOL, atol=0)
    assert out["value"] == area("a", sample) - area("b", sample)


def test_a_95_percent_interval_covers_a_known_mean_about_95_percent_of_the_time():
    # Probabilistic by nature, deterministic here (fixed seeds). Each trial is 100 values
    # u^2 (u uniform on [0, 1]: skewed, mean 1/3). A correct 95% percentile interval covers
    # 1/3 in about 94-95% of trials (the method runs slightly short at P = 100); over 400
    # trials the covered share has a standard deviation of about 0.011, so [0.90, 0.98] is
    # about four of them either side. The 50% interval must cover about half the time (sd
    # 0.025, band [0.40, 0.60]), which catches a level that is not passed through.
    gen = np.random.default_rng(11)
    covered = {0.95: 0, 0.5: 0}
    for trial in range(400):
        sample = gen.random(100) ** 2
        for level in covered:
            lo, hi = bootstrap_ci(sample, np.random.default_rng(trial), 500, level)
            covered[level] += lo <= 1 / 3 <= hi
    assert 0.90 <= covered[0.95] / 400 <= 0.98
    assert 0.40 <= covered[0.5] / 400 <= 0.60
