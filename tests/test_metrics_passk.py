"""pass@k, pass^k, maj@k, bootstrap intervals, and the metrics.json summary built from them."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from es_llm.metrics.passk import (
    bootstrap_ci,
    ks_powers_of_two,
    maj_at_k_per_problem,
    pass_at_k,
    pass_at_k_per_problem,
    pass_hat_k,
    pass_hat_k_per_problem,
)
from es_llm.metrics.summary import evaluation_metrics, format_table


# ---------------------------------------------------------------- pass@k


def test_pass_at_k_hand_values():
    # 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # k = 1 is the plain success rate: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-15)
    # n - c = 1 < k = 2: every 2-subset holds a correct sample
    assert pass_at_k(5, 4, 2) == 1.0
    # no correct sample at all
    assert pass_at_k(5, 0, 3) == 0.0
    # k = n: solved iff c >= 1
    assert pass_at_k(5, 1, 5) == 1.0


@pytest.mark.parametrize("n, c, k", [(5, 1, 6), (5, 1, 0), (5, 6, 2), (5, -1, 2)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def _grid(ns):
    for n in ns:
        for k in sorted({1, 2, 3, max(1, n // 4), max(1, n // 2), max(1, n - 1), n}):
            if k > n:
                continue
            for c in sorted({0, 1, 2, k - 1, n // 3, n // 2, n - k, n - k + 1, n - 1, n}):
                if 0 <= c <= n:
                    yield n, c, k


def test_pass_at_k_matches_exact_fraction_up_to_n_4096():
    worst = 0.0
    for n, c, k in _grid([1, 2, 3, 7, 64, 1000, 4096]):
        exact = float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))
        worst = max(worst, abs(pass_at_k(n, c, k) - exact))
    assert worst < 1e-12


def test_pass_at_k_large_n_is_finite_and_exact():
    # The naive C(n-c,k)/C(n,k) in floats overflows to inf/inf = NaN here.
    # With c = 1: C(n-1,k)/C(n,k) = (n-k)/n, so pass@1024 of n=2048 is 1 - 1024/2048 = 0.5.
    value = pass_at_k(2048, 1, 1024)
    assert math.isfinite(value)
    assert value == pytest.approx(0.5, abs=1e-14)
    # c = 2: 1 - (n-k)(n-k-1) / (n(n-1)) = 1 - 1024*1023/(2048*2047)
    assert pass_at_k(2048, 2, 1024) == pytest.approx(1 - 1024 * 1023 / (2048 * 2047), abs=1e-14)


def test_pass_at_k_per_problem_ragged_and_array_inputs():
    ragged = [[True, False], [False, False, False, True], [True]]
    # k=1: c/n = 1/2, 1/4, 1/1
    np.testing.assert_allclose(pass_at_k_per_problem(ragged, 1), [0.5, 0.25, 1.0])
    square = np.array([[1, 0, 0, 1], [0, 0, 0, 0]], dtype=bool)
    # pass@2 with n=4, c=2: 1 - C(2,2)/C(4,2) = 1 - 1/6
    np.testing.assert_allclose(pass_at_k_per_problem(square, 2), [5 / 6, 0.0])
    np.testing.assert_allclose(pass_at_k_per_problem(list(square), 2), pass_at_k_per_problem(square, 2))
    with pytest.raises(ValueError):
        pass_at_k_per_problem(ragged, 2)  # the third problem has only one sample
    with pytest.raises(ValueError):
        pass_at_k_per_problem([[0.5, 1.0]], 1)  # rewards are not booleans


# ---------------------------------------------------------------- pass^k


def test_pass_hat_k_hand_values():
    # C(3,2)/C(5,2) = 3/10 = (3/5)(2/4)
    assert pass_hat_k(5, 3, 2) == pytest.approx(0.3, abs=1e-15)
    assert pass_hat_k(5, 2, 3) == 0.0  # fewer correct samples than draws
    assert pass_hat_k(5, 5, 5) == 1.0
    # k = 1 is again the success rate
    assert pass_hat_k(5, 3, 1) == pytest.approx(0.6, abs=1e-15)
    with pytest.raises(ValueError):
        pass_hat_k(3, 1, 4)


def test_pass_hat_k_matches_exact_fraction():
    worst = 0.0
    for n, c, k in _grid([1, 3, 64, 4096]):
        exact = float(Fraction(math.comb(c, k), math.comb(n, k)))
        worst = max(worst, abs(pass_hat_k(n, c, k) - exact))
    assert worst < 1e-12


def test_pass_hat_k_per_problem():
    # problem 0: C(2,2)/C(3,2) = 1/3; problem 1: no correct pair
    np.testing.assert_allclose(pass_hat_k_per_problem([[1, 1, 0], [1, 0, 0, 0]], 2), [1 / 3, 0.0])


# ---------------------------------------------------------------- maj@k


def test_maj_at_k_hand_example():
    rng = np.random.default_rng(0)
    correct = [[False, False, True]]
    keys = [["a", "a", "b"]]  # key "b" is the correct one
    # k=1: each sample elects itself: a, a, b -> 1/3
    assert maj_at_k_per_problem(correct, keys, 1, rng)[0] == pytest.approx(1 / 3)
    # k=2: {a,a}: a wins -> 0; {a,b}: tie -> 1/2; {a,b}: tie -> 1/2; mean = 1/3
    assert maj_at_k_per_problem(correct, keys, 2, rng)[0] == pytest.approx(1 / 3)
    # k=3: a has 2 votes vs 1 -> 0
    assert maj_at_k_per_problem(correct, keys, 3, rng)[0] == 0.0


def test_maj_at_k_none_does_not_vote_and_key_correct_if_any_sample_correct():
    rng = np.random.default_rng(0)
    # k=2 subsets: {None,None}: nobody votes -> 0; {None,x}: x -> 1; {None,x}: x -> 1; mean 2/3
    value = maj_at_k_per_problem([[False, False, True]], [[None, None, "x"]], 2, rng)[0]
    assert value == pytest.approx(2 / 3)
    # Both samples say "a"; one is graded correct, so "a" is a correct key and maj@1 = 1.
    assert maj_at_k_per_problem([[True, False]], [["a", "a"]], 1, rng)[0] == 1.0
    with pytest.raises(ValueError):
        maj_at_k_per_problem([[True]], [["a", "b"]], 1, rng)


def _maj_bruteforce(correct, keys, k):
    """Independent reference: enumerate every subset and apply the voting rule literally."""
    good = {key for key, ok in zip(keys, correct) if ok and key is not None}
    scores = []
    for subset in itertools.combinations(range(len(keys)), k):
        votes = Counter(keys[i] for i in subset if keys[i] is not None)
        if not votes:
            scores.append(Fraction(0))
            continue
        top = max(votes.values())
        tied = [key for key, count in votes.items() if count == top]
        scores.append(Fraction(sum(key in good for key in tied), len(tied)))
    return float(sum(scores) / len(scores))


def test_maj_at_k_exact_enumeration_matches_bruteforce():
    gen = np.random.default_rng(1)
    for _ in range(6):
        n = int(gen.integers(3, 9))
        keys = [None if r < 0.2 else "abc"[int(r * 10) % 3] for r in gen.random(n)]
        correct = [key == "b" for key in keys]
        for k in range(1, n + 1):
            got = maj_at_k_per_problem([correct], [keys], k, np.random.default_rng(0), num_subsets=10**6)[0]
            assert got == pytest.approx(_maj_bruteforce(correct, keys, k), abs=1e-12)


def test_maj_at_k_monte_carlo_close_to_exact():
    keys = [["a"] * 5 + ["b"] * 4 + ["c"] * 3 + [None] * 2, ["x"] * 3 + ["y"] * 3 + ["z"] * 8]
    correct = [[key == "b" for key in keys[0]], [key == "y" for key in keys[1]]]
    # C(14,6) = 3003 subsets: 10**4 enumerates them, 3000 < 3003 forces Monte Carlo.
    exact = maj_at_k_per_problem(correct, keys, 6, np.random.default_rng(0), num_subsets=10**4)
    mc = maj_at_k_per_problem(correct, keys, 6, np.random.default_rng(0), num_subsets=3000)
    # Each subset scores in [0,1], so the MC standard error is <= 0.5/sqrt(3000) ~ 0.009.
    np.testing.assert_allclose(mc, exact, atol=0.04)
    assert not np.allclose(mc, exact, atol=1e-12)  # it really was sampled
    again = maj_at_k_per_problem(correct, keys, 6, np.random.default_rng(0), num_subsets=3000)
    np.testing.assert_array_equal(mc, again)


# ---------------------------------------------------------------- bootstrap and ks


def test_bootstrap_ci_contains_mean_and_shrinks():
    gen = np.random.default_rng(2)
    small = gen.random(20)
    large = gen.random(2000)
    lo_s, hi_s = bootstrap_ci(small, np.random.default_rng(3))
    lo_l, hi_l = bootstrap_ci(large, np.random.default_rng(3))
    assert lo_s <= small.mean() <= hi_s
    assert lo_l <= large.mean() <= hi_l
    # width ~ 1/sqrt(P): 100x the problems -> about 10x narrower
    assert (hi_l - lo_l) < (hi_s - lo_s) / 3
    assert bootstrap_ci(small, np.random.default_rng(3)) == (lo_s, hi_s)
    assert bootstrap_ci([0.25] * 5, np.random.default_rng(0)) == (0.25, 0.25)
    with pytest.raises(ValueError):
        bootstrap_ci([], np.random.default_rng(0))
    with pytest.raises(ValueError):
        bootstrap_ci([0.1, float("nan")], np.random.default_rng(0))


def test_ks_powers_of_two():
    assert ks_powers_of_two(1) == [1]
    assert ks_powers_of_two(8) == [1, 2, 4, 8]
    assert ks_powers_of_two(10) == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError):
        ks_powers_of_two(0)


# ---------------------------------------------------------------- summary


def test_evaluation_metrics_and_table():
    ids = ["p1", "p2", "p3"]
    correct = [[True, False, False, True], [False] * 4, [True] * 4]
    answer_keys = [["1", "2", "2", "1"], ["7", None, "8", "8"], ["3"] * 4]
    solution_keys = [["s", None, None, "t"], [None] * 4, ["u", "u", "v", "u"]]
    texts = [["one step", "two", "two steps", "one more"], ["x"] * 4, ["three is it", "three", "3", "yes three"]]
    metrics = evaluation_metrics(
        ids, correct, answer_keys, solution_keys, texts, 4, np.random.default_rng(0),
        difficulties=["easy", "hard", "easy"], num_resamples=200,
    )
    json.dumps(metrics, allow_nan=False)
    assert [key for key in metrics if key.startswith("pass@")] == ["pass@1", "pass@2", "pass@4"]
    # pass@1 = mean(2/4, 0, 1) = 0.5; pass@4 = mean(1, 0, 1) = 2/3
    assert metrics["pass@1"]["value"] == pytest.approx(0.5)
    assert metrics["pass@4"]["value"] == pytest.approx(2 / 3)
    lo, hi = metrics["pass@1"]["ci95"]
    assert lo <= 0.5 <= hi
    # pass^2: p1 C(2,2)/C(4,2) = 1/6, p2 0, p3 1 -> mean 7/18
    assert metrics["pass^2"]["value"] == pytest.approx(7 / 18)
    # maj@4: p1 tie "1" (correct) vs "2" -> 1/2; p2 "8" wrong -> 0; p3 -> 1; mean 1/2
    assert metrics["maj@4"]["value"] == pytest.approx(0.5)
    assert metrics["num_problems"] == 3 and metrics["num_samples"] == 4
    assert metrics["coverage"]["solved"] == 2 and metrics["coverage"]["solved_ids"] == ["p1", "p3"]
    assert metrics["by_difficulty"]["easy"] == {"pass@1": 0.75, "pass@n": 1.0, "num_problems": 2}
    # distinct correct solutions: p1 {s,t}=2, p2 0, p3 {u,v}=2 -> 4/3
    assert metrics["diversity"]["distinct_correct_solutions"] == pytest.approx(4 / 3)
    table = format_table(metrics)
    assert "pass@k" in table and "maj@k" in table and "coverage" in table and "self_bleu" in table
    # One row per k = 1, 2, 4, each starting with k and pass@k.
    rows = [line.split() for line in table.splitlines()]
    assert [r[:2] for r in rows if r and r[0] in {"1", "2", "4"}] == \
        [["1", "0.500"], ["2", "0.611"], ["4", "0.667"]]
    # Accuracy under 2%: only p2 (0/4) -> 1/3.
    assert metrics["coverage"]["share_accuracy_below_2pct"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        evaluation_metrics(ids, correct, answer_keys, solution_keys, texts, 8, np.random.default_rng(0))
