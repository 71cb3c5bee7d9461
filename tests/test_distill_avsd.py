"""AVSD: consensus, Jensen residual, gate and target by hand; the bound lambda J <= |A|."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.distill.avsd import avsd_target, jensen_bound_holds

F64 = torch.float64
LN = math.log


def views(*qs):
    """(M, 1, 1, C) log-probs from probability lists."""
    return torch.log(torch.tensor(qs, dtype=F64))[:, None, None, :]


P_HALF = torch.log(torch.tensor([0.5, 0.5], dtype=F64))[None, None, :]
SUP2 = torch.ones(1, 1, 2, dtype=torch.bool)
ONE = torch.ones(1, 1)


def test_two_views_by_hand():
    # q1 = [0.9, 0.1], q2 = [0.5, 0.5], p = [0.5, 0.5], w = [1/2, 1/2].
    # Geometric: sqrt([0.45, 0.05]) = [3, 1] * sqrt(0.05) -> q_G = [0.75, 0.25].
    # Arithmetic: q_A = [0.7, 0.3]. J = max(ln(q_A / q_G), 0) = [0, ln 1.2].
    # Delta1 = [ln 1.8, ln 0.2], Delta2 = [0, 0]: adv_mean = [ln 1.8 / 2, ln 0.2 / 2]
    # = [0.293893, -0.804719]; C = |mean| / mean|.| = 1; R = [1, 0.804719 / (0.804719 + 0.182322)].
    # Target: [0.75, 0.25 e^{lambda1 J1}] renormalised = [0.721109, 0.278891].
    o = avsd_target(views([0.9, 0.1], [0.5, 0.5]), P_HALF, SUP2, ONE)
    assert torch.allclose(o["consensus"].exp().flatten(), torch.tensor([0.75, 0.25], dtype=F64))
    assert torch.allclose(o["residual"].flatten(), torch.tensor([0.0, LN(1.2)], dtype=F64))
    a1 = 0.5 * LN(0.2)
    assert torch.allclose(o["adv_mean"].flatten(), torch.tensor([0.5 * LN(1.8), a1], dtype=F64))
    lam1 = abs(a1) / (abs(a1) + LN(1.2))
    assert torch.allclose(o["gate"].flatten(), torch.tensor([1.0, lam1], dtype=F64))
    u = 0.25 * math.exp(lam1 * LN(1.2))
    want = torch.tensor([0.75 / (0.75 + u), u / (0.75 + u)], dtype=F64)
    assert torch.allclose(o["target"].exp().flatten(), want)
    assert torch.allclose(want, torch.tensor([0.721109, 0.278891], dtype=F64), atol=1e-6)


def test_disagreeing_views_shrink_the_gate():
    # q1 = [0.9, 0.1], q2 = [0.1, 0.9]: at candidate 0, Delta = [ln 1.8, ln 0.2],
    # mean = (ln 1.8 + ln 0.2) / 2 = ln 0.6, |mean| = 0.510826,
    # mean|.| = ln 3 = 1.098612: C = 0.464974.
    # q_G = [0.5, 0.5] = q_A, so J = 0 and the target is the consensus (uniform).
    o = avsd_target(views([0.9, 0.1], [0.1, 0.9]), P_HALF, SUP2, ONE)
    assert torch.allclose(o["residual"], torch.zeros(1, 1, 2, dtype=F64), atol=1e-15)
    assert torch.allclose(o["gate"], torch.full((1, 1, 2), abs(LN(0.6)) / LN(3.0), dtype=F64))
    assert torch.allclose(o["target"].exp(), torch.full((1, 1, 2), 0.5, dtype=F64))


def test_identical_views_give_the_view():
    o = avsd_target(views([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),
                    torch.zeros(1, 1, 3, dtype=F64), torch.ones(1, 1, 3, dtype=torch.bool), ONE)
    assert torch.allclose(o["target"].exp().flatten(), torch.tensor([0.2, 0.3, 0.5], dtype=F64))
    assert torch.all(o["residual"].abs() < 1e-12)


def test_bound_never_flips_the_consensus():
    g = torch.Generator().manual_seed(0)
    M, B, T, C = 3, 2, 5, 6
    v = 3 * torch.randn(M, B, T, C, generator=g, dtype=F64)
    s = 3 * torch.randn(B, T, C, generator=g, dtype=F64)
    sup = torch.rand(B, T, C, generator=g) > 0.3
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    o = avsd_target(v, s, sup, mask, weights_M=torch.tensor([0.5, 0.3, 0.2], dtype=F64))
    lj, a = o["gate"] * o["residual"], o["adv_mean"]
    assert bool((lj <= a.abs() + 1e-12).all())
    assert bool(jensen_bound_holds(o))
    assert bool(((a + lj) * a >= -1e-12).all())  # same sign or zero
    assert bool((o["gate"] >= 0).all() and (o["gate"] <= 1 + 1e-12).all())
    assert torch.all(o["target"][mask == 0] == 0) and torch.all(o["target"][~sup] == 0)
    # Each supported position's target is a distribution over its support.
    row = (sup & mask.bool()[..., None]).any(-1)
    live = sup & mask.bool()[..., None]
    tot = torch.where(live, o["target"].exp(), torch.zeros((), dtype=F64)).sum(-1)
    assert torch.allclose(tot[row], torch.ones_like(tot[row]))


def test_jensen_bound_check_can_fail():
    bad = {"gate": torch.ones(1), "residual": torch.ones(1), "adv_mean": torch.full((1,), 0.5)}
    assert not bool(jensen_bound_holds(bad))


def test_bad_shapes():
    with pytest.raises(ValueError, match="view_logp_M_B_T_C"):
        avsd_target(torch.zeros(2, 1, 1, 3), torch.zeros(1, 1, 2), SUP2, ONE)
    with pytest.raises(ValueError, match="weights_M"):
        avsd_target(views([0.5, 0.5]), P_HALF, SUP2, ONE, weights_M=torch.ones(2))
