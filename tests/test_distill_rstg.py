"""RSTG: failure gate, annealing, soft-OR scores, top-k% selection and the hybrid advantage."""

from __future__ import annotations

import pytest
import torch

from gradient.distill.rstg import (failed_groups, hybrid_advantage, linear_anneal,
                                   soft_or_scores, top_fraction)

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


def test_failed_groups():
    r = t([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert failed_groups(r).tolist() == [True, False, False]
    assert failed_groups(t([[-1.0, -1.0], [-1.0, 1.0]]), fail_reward=-1.0).tolist() == [True, False]


def test_linear_anneal():
    # Paper schedule: 5e-3 - 5e-5 * 40 = 3e-3; after 80 steps the floor 1e-3.
    assert linear_anneal(0, 5e-3, 5e-5, 1e-3) == 5e-3
    assert linear_anneal(40, 5e-3, 5e-5, 1e-3) == pytest.approx(3e-3)
    assert linear_anneal(500, 5e-3, 5e-5, 1e-3) == 1e-3


def test_soft_or_by_hand():
    # Entropy [1, 2, 4, (9 masked)] / max 4 = [0.25, 0.5, 1];
    # |A| = [2, 0.5, 0, (masked)] / max 2 = [1, 0.25, 0].
    # s = h + d - h d: [0.25 + 1 - 0.25, 0.5 + 0.25 - 0.125, 1 + 0 - 0] = [1, 0.625, 1].
    ent = t([[1.0, 2.0, 4.0, 9.0]])
    adv = t([[-2.0, 0.5, 0.0, 50.0]])
    m = torch.tensor([[1, 1, 1, 0]])
    assert torch.allclose(soft_or_scores(ent, adv, m), t([[1.0, 0.625, 1.0, 0.0]]))


def test_soft_or_zero_row_and_range():
    s = soft_or_scores(t([[0.0, 0.0]]), t([[0.0, 0.0]]), torch.ones(1, 2))
    assert torch.equal(s, torch.zeros(1, 2, dtype=F64))
    g = torch.Generator().manual_seed(0)
    s = soft_or_scores(torch.rand(3, 6, generator=g, dtype=F64),
                       torch.randn(3, 6, generator=g, dtype=F64), torch.ones(3, 6))
    assert bool((s >= 0).all() and (s <= 1).all())


def test_top_fraction_by_hand():
    # Row 0: 4 tokens, frac 0.5 -> 2 kept: the scores 0.9 and 0.7.
    # Row 1: 3 masked tokens, ceil(1.5) = 2 kept: 0.8 and the first of the tied 0.5s.
    score = t([[0.1, 0.9, 0.7, 0.3], [0.5, 0.8, 0.5, 0.99]])
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    sel = top_fraction(score, m, 0.5)
    assert sel.tolist() == [[False, True, True, False], [True, True, False, False]]
    assert torch.equal(top_fraction(score, m, 1.0), m.bool())
    assert not top_fraction(score, m, 0.0).any()


def test_hybrid_advantage_by_hand():
    # Row 0 failed: 0.5 * 0.8 * [2, -1, 3] on selected [1, 0, 1] = [0.8, 0, 1.2].
    # Row 1 not failed: GRPO 0.7 on its masked tokens, 0 at the masked one.
    adv_opd = t([[2.0, -1.0, 3.0], [9.0, 9.0, 9.0]])
    sel = torch.tensor([[1, 0, 1], [0, 0, 0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = hybrid_advantage(t([0.0, 0.7]), adv_opd, torch.tensor([True, False]), t([0.8, 0.1]),
                           0.5, sel, m)
    assert torch.allclose(out, t([[0.8, 0.0, 1.2], [0.7, 0.7, 0.0]]))
    assert not out.requires_grad


def test_hybrid_advantage_bad_shapes():
    with pytest.raises(ValueError, match="omega_B"):
        hybrid_advantage(t([0.0]), t([[1.0]]), torch.tensor([True]), t([0.5, 0.5]), 0.1,
                         torch.ones(1, 1), torch.ones(1, 1))
