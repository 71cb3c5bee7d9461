"""DAPO's dynamic-sampling filter and overlong penalty against hand values."""

from __future__ import annotations

import pytest
import torch

from gradient.maths.dapo import keep_groups, overlong_penalty, zero_variance_groups

REWARDS = torch.tensor([[1.0, 1.0, 1.0],            # all solved: no signal
                        [0.0, 1.0, 0.0],            # mixed
                        [0.1, 0.1, 0.1],            # all equal, not exactly representable
                        [0.1, 0.1, 0.1 + 1e-12],    # differs in the 12th digit: kept
                        [0.0, 0.0, 0.0],            # all failed: no signal
                        [0.5, 0.0, 1.0]], dtype=torch.float64)


def test_zero_variance_groups_use_exact_equality():
    assert zero_variance_groups(REWARDS).tolist() == [True, False, True, False, True, False]
    assert zero_variance_groups(torch.tensor([[3.0]])).tolist() == [True]


def test_keep_groups_in_order_and_up_to_a_limit():
    assert keep_groups(REWARDS).tolist() == [1, 3, 5]
    assert keep_groups(REWARDS, limit=2).tolist() == [1, 3]
    assert keep_groups(REWARDS, limit=10).tolist() == [1, 3, 5]  # fewer survive: all of them
    assert keep_groups(REWARDS[[0, 2, 4]]).tolist() == []
    assert keep_groups(REWARDS).dtype == torch.int64
    with pytest.raises(ValueError, match="limit"):
        keep_groups(REWARDS, limit=-1)


def test_overlong_penalty_by_hand():
    # max_len 20, buffer 4: expected = 16. Penalty -(len - 16)/4 * factor beyond 16:
    # 10 -> 0, 16 -> 0, 17 -> -0.25, 18 -> -0.5, 20 -> -1, 24 -> -2 clamped to -1.
    lengths = torch.tensor([10, 16, 17, 18, 20, 24])
    got = overlong_penalty(lengths, 20, 4, 1.0)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert got.dtype == torch.float64
    # Factor 0.5 halves it, and the floor moves to -0.5.
    assert overlong_penalty(lengths, 20, 4, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5, -0.5]
    # buffer_len = max_len: every token costs factor / max_len.
    assert overlong_penalty(torch.tensor([0, 5, 10]), 10, 10, 1.0).tolist() == [0.0, -0.5, -1.0]


def test_overlong_penalty_validates():
    lengths = torch.tensor([3])
    for bad in (0, 21, -1, 2.5):
        with pytest.raises(ValueError, match="buffer_len"):
            overlong_penalty(lengths, 20, bad, 1.0)
    with pytest.raises(ValueError, match="max_len"):
        overlong_penalty(lengths, 0, 1, 1.0)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_penalty(lengths, 20, 4, -1.0)
    with pytest.raises(ValueError, match="lengths_B"):
        overlong_penalty(torch.tensor([[3]]), 20, 4, 1.0)
    with pytest.raises(ValueError, match="rewards_P_G"):
        zero_variance_groups(torch.ones(3))
