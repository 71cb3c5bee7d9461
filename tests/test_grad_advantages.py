"""Group advantage estimators against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.maths.advantages import (AdvantageInput, advantage_names, compute_advantages, grpo,
                                 register_advantage)

# Three groups of G = 3: a binary group, a graded one, and a constant one. 0.1 is not exact
# in binary, so the mean of the third group misses 0.1 by an ulp.
TABLE = torch.tensor([[1.0, 0.0, 0.0],
                      [2.0, 4.0, 6.0],
                      [0.1, 0.1, 0.1]], dtype=torch.float64)


def adv(name: str, rewards=TABLE, **kw) -> torch.Tensor:
    return compute_advantages(name, AdvantageInput(rewards, **kw))


def test_registry_holds_the_three_estimators():
    assert advantage_names() == ["dr_grpo", "grpo", "rloo"]


def test_grpo_by_hand():
    # Group 0: mean 1/3, deviations [2/3, -1/3, -1/3]; Bessel variance (4/9 + 1/9 + 1/9) / 2
    # = 1/3, std 1/sqrt(3); z = [2/sqrt(3), -1/sqrt(3), -1/sqrt(3)] = [1.1547, -0.5774, -0.5774].
    # Group 1: mean 4, deviations [-2, 0, 2]; variance (4 + 0 + 4) / 2 = 4, std 2; z = [-1, 0, 1].
    # Group 2: constant, exactly 0.
    s3 = math.sqrt(3)
    sd = 1 / s3 + 1e-6
    expected = torch.tensor([[2 / 3 / sd, -1 / 3 / sd, -1 / 3 / sd],
                             [-2 / (2 + 1e-6), 0.0, 2 / (2 + 1e-6)],
                             [0.0, 0.0, 0.0]], dtype=torch.float64)
    got = adv("grpo")
    assert torch.allclose(got, expected, rtol=0, atol=1e-15)
    assert got[2].tolist() == [0.0, 0.0, 0.0]
    # With eps = 0 the binary group is exactly [2, -1, -1] / sqrt(3).
    got0 = adv("grpo", std_eps=0.0)
    assert torch.allclose(got0[0], torch.tensor([2 / s3, -1 / s3, -1 / s3], dtype=torch.float64))


def test_grpo_std_and_eps_choices_are_explicit():
    # Population std of group 1: variance 8 / 3, std 1.63299; z = [-2, 0, 2] / 1.63299.
    pop = adv("grpo", std_eps=0.0, unbiased_std=False)
    assert torch.allclose(pop[1], torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64)
                          * 2 / math.sqrt(8 / 3))
    # TRL's eps 1e-4 on group 1: [-2, 0, 2] / (2 + 1e-4).
    trl = adv("grpo", std_eps=1e-4)
    assert torch.allclose(trl[1], torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64) / 2.0001,
                          rtol=0, atol=1e-15)
    assert AdvantageInput(TABLE).std_eps == 1e-6 and AdvantageInput(TABLE).unbiased_std


def test_dr_grpo_by_hand():
    # Plain deviations from the group mean; no std.
    expected = [[2 / 3, -1 / 3, -1 / 3], [-2.0, 0.0, 2.0], [0.0, 0.0, 0.0]]
    got = adv("dr_grpo")
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)
    assert got[2].tolist() == [0.0, 0.0, 0.0]


def test_rloo_by_hand_and_against_a_leave_one_out_loop():
    # Group 0: 1 - mean(0, 0) = 1, 0 - mean(1, 0) = -0.5, -0.5.
    # Group 1: 2 - mean(4, 6) = -3, 4 - 4 = 0, 6 - 3 = 3.
    got = adv("rloo")
    assert torch.allclose(got, torch.tensor([[1.0, -0.5, -0.5], [-3.0, 0.0, 3.0], [0, 0, 0]],
                                            dtype=torch.float64), rtol=0, atol=1e-15)
    assert got[2].tolist() == [0.0, 0.0, 0.0]
    r = torch.randn(5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    loop = torch.stack([torch.stack([r[p, i] - torch.cat([r[p, :i], r[p, i + 1:]]).mean()
                                     for i in range(4)]) for p in range(5)])
    assert torch.allclose(adv("rloo", r), loop, rtol=0, atol=1e-12)


def test_all_equal_groups_are_exactly_zero_for_every_estimator():
    r = torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.7, 0.7, 0.7, 0.7]])
    for name in advantage_names():
        for eps in (0.0, 1e-6):
            assert adv(name, r, std_eps=eps).tolist() == [[0.0] * 4] * 2, name


def test_output_dtype():
    assert adv("grpo", TABLE.float()).dtype == torch.float32
    assert adv("dr_grpo", torch.tensor([[1, 0], [0, 0]])).dtype == torch.get_default_dtype()
    assert adv("dr_grpo", torch.tensor([[1, 0], [0, 0]])).tolist() == [[0.5, -0.5], [0.0, 0.0]]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        AdvantageInput(torch.ones(3, 1))
    with pytest.raises(ValueError, match="finite"):
        AdvantageInput(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="2-D"):
        AdvantageInput(torch.ones(4))
    with pytest.raises(ValueError, match="std_eps"):
        AdvantageInput(TABLE, std_eps=-1.0)
    with pytest.raises(ValueError, match="dr_grpo, grpo, rloo"):
        adv("ppo")


def test_reregistering_a_different_function_raises():
    assert register_advantage("grpo")(grpo) is grpo  # the same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda inp: inp.rewards_P_G)
