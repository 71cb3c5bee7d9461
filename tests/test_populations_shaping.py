"""Fitness shaping against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from populations.shaping import ShapingInput, register_shaping, shape_fitness, shaping_names


def col(*values) -> torch.Tensor:
    """One prompt per member: rewards_N_P of shape (N, 1)."""
    return torch.tensor(values, dtype=torch.float64)[:, None]


def test_registry_holds_the_five_shapings():
    assert shaping_names() == ["centered_rank", "group_zscore", "pair_diff", "raw", "zscore"]


def test_centered_ranks_by_hand():
    # Fitness [10, -10, 5, 3] has ranks (0 = worst) [3, 0, 2, 1]; rank / (N - 1) - 0.5 with
    # N - 1 = 3 gives [1 - .5, 0 - .5, 2/3 - .5, 1/3 - .5] = [0.5, -0.5, 1/6, -1/6].
    w = shape_fitness("centered_rank", col(10, -10, 5, 3))
    assert w.dtype == torch.float64
    assert torch.allclose(w, torch.tensor([0.5, -0.5, 1 / 6, -1 / 6], dtype=torch.float64))


def test_centered_ranks_use_row_means():
    # Rows average to [10, -10, 5, 3] again, so the weights are the same.
    r = torch.tensor([[12.0, 8.0], [-10.0, -10.0], [0.0, 10.0], [3.0, 3.0]])
    assert torch.allclose(shape_fitness("centered_rank", r),
                          shape_fitness("centered_rank", col(10, -10, 5, 3)))


def test_tied_members_get_the_average_rank():
    # Binary rewards [1, 0, 1, 0, 1]: the 0s span ranks 0, 1 (average 0.5) and the 1s span
    # ranks 2, 3, 4 (average 3). With N - 1 = 4: 0.5/4 - 0.5 = -0.375 and 3/4 - 0.5 = 0.25.
    # argsort ranks would instead give the three equal members three different weights.
    w = shape_fitness("centered_rank", col(1, 0, 1, 0, 1))
    assert w.tolist() == [0.25, -0.375, 0.25, -0.375, 0.25]
    assert float(w.sum()) == 0.0
    # All tied: every member has average rank (N - 1) / 2, i.e. weight 0 (no update).
    assert shape_fitness("centered_rank", col(2, 2, 2)).tolist() == [0.0, 0.0, 0.0]
    assert shape_fitness("centered_rank", col(7)).tolist() == [0.0]


def test_zscore_by_hand():
    # Member means [2, 0, 2, 4]: mean 2, deviations [0, -2, 0, 2], population variance
    # (0 + 4 + 0 + 4) / 4 = 2, std sqrt(2); z = [0, -sqrt 2, 0, sqrt 2] before eps. With
    # eps = 1e-8 the divisor is sqrt(2) + 1e-8.
    r = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0, 2.0], [5.0, 3.0]])
    s = math.sqrt(2)
    expected = torch.tensor([0.0, -2 / (s + 1e-8), 0.0, 2 / (s + 1e-8)], dtype=torch.float64)
    assert torch.allclose(shape_fitness("zscore", r), expected, rtol=0, atol=1e-15)
    assert torch.allclose(shape_fitness("zscore", r, eps=0.0),
                          torch.tensor([0.0, -s, 0.0, s], dtype=torch.float64), atol=1e-15)


def test_constant_rewards_give_exactly_zero_weights():
    # The mean of three 0.1s is 0.10000000000000002 in float64; without the explicit check
    # the z-scores would be ~1.4e-17 / 1e-8 ~ 1e-9 instead of 0, a spurious update.
    for r in (col(0.1, 0.1, 0.1), col(0.1, 0.1, 0.1, 0.1)):
        N = r.shape[0]
        for name in shaping_names():
            if name == "pair_diff" and N % 2:
                continue  # mirrored pairs only (tested in test_populations_lowrank.py)
            assert shape_fitness(name, r).tolist() == [0.0] * N, name


def test_group_zscore_by_hand_with_a_zero_variance_column():
    # Prompt 0 scores [1, 0, 2]: mean 1, deviations [0, -1, 1], population variance 2/3, so
    # z = [0, -sqrt(3/2), sqrt(3/2)] (eps = 0 here). Prompt 1 scores [5, 5, 5]: no signal,
    # contributes 0. Averaging over the 2 prompts: [0, -sqrt(3/2)/2, sqrt(3/2)/2]
    # = [0, -0.6124, 0.6124].
    r = torch.tensor([[1.0, 5.0], [0.0, 5.0], [2.0, 5.0]])
    h = math.sqrt(1.5) / 2
    expected = torch.tensor([0.0, -h, h], dtype=torch.float64)
    assert torch.allclose(shape_fitness("group_zscore", r, eps=0.0), expected, atol=1e-15)
    # Plain zscore sees row means [3, 2.5, 3.5] and gives [0, -sqrt 1.5, sqrt 1.5]: the
    # constant prompt does not halve it, so the two shapings differ.
    assert torch.allclose(shape_fitness("zscore", r, eps=0.0), 2 * expected, atol=1e-15)


def test_group_zscore_equals_a_looped_reference():
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 3, (6, 5), generator=g).double()
    looped = torch.zeros(6, dtype=torch.float64)
    for p in range(5):
        c = r[:, p]
        if c.max() > c.min():
            looped += (c - c.mean()) / (c.std(correction=0) + 1e-8)
    assert torch.allclose(shape_fitness("group_zscore", r), looped / 5, atol=1e-14)


def test_raw_is_centred_fitness():
    # Mean of [1, 2, 6] is 3.
    assert shape_fitness("raw", col(1, 2, 6)).tolist() == [-2.0, -1.0, 3.0]


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="centered_rank, group_zscore, pair_diff, raw, zscore"):
        shape_fitness("rank", col(1, 2))


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 2.0]), torch.zeros(0, 3),
                                 torch.tensor([[1.0], [float("nan")]]),
                                 torch.tensor([[1.0], [float("inf")]])])
def test_bad_rewards_raise(bad):
    with pytest.raises(ValueError):
        ShapingInput(bad)


def test_registering_a_second_function_under_a_taken_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_shaping("zscore")(lambda inp: inp.fitness_N)
