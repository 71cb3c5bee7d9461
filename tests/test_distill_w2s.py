"""W2S-OPD: the proxy teacher's logits and its top-K reverse KL, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.distill.w2s import proxy_reverse_kl, proxy_teacher_logits

F64 = torch.float64
LN = math.log


def t(x):
    return torch.tensor(x, dtype=F64)


def test_proxy_logits_by_hand():
    # base [1, 0, -1] + 2 * ([0.5, 0, 0] - [0, 0.5, 0]) = [2, -1, -1].
    z = proxy_teacher_logits(t([[[1.0, 0.0, -1.0]]]), t([[[0.5, 0.0, 0.0]]]),
                             t([[[0.0, 0.5, 0.0]]]), 2.0)
    assert torch.equal(z, t([[[2.0, -1.0, -1.0]]]))


def test_alpha_zero_is_the_base_and_result_is_detached():
    base = t([[[1.0, 2.0]]]).requires_grad_()
    z = proxy_teacher_logits(base, t([[[5.0, 0.0]]]), t([[[0.0, 5.0]]]), 0.0)
    assert torch.equal(z, base.detach()) and not z.requires_grad


def test_reverse_kl_over_top2_by_hand():
    # Proxy logits [ln 6, ln 3, 0]: top-2 {0, 1} renormalised = [2/3, 1/3].
    # Student logits [ln 1, ln 3, ln 100]: over {0, 1} renormalised = [1/4, 3/4].
    # KL(S || T) = 1/4 ln(3/8) + 3/4 ln(9/4) = -0.245207 + 0.608198 = 0.362991
    want = 0.25 * LN(0.25 / (2 / 3)) + 0.75 * LN(0.75 / (1 / 3))
    got = proxy_reverse_kl(t([[[0.0, LN(3.0), LN(100.0)]]]), t([[[LN(6.0), LN(3.0), 0.0]]]),
                           torch.ones(1, 1), 2)
    assert got.item() == pytest.approx(want, abs=1e-12)
    assert got.item() == pytest.approx(0.362991, abs=1e-6)


def test_student_equal_to_proxy_gives_zero_and_masking():
    z = t([[[0.3, -1.0, 2.0], [1.0, 1.0, 1.0]]])
    got = proxy_reverse_kl(z, z, torch.tensor([[1, 0]]), 2)
    assert torch.allclose(got, torch.zeros(1, 2, dtype=F64), atol=1e-15)


def test_bad_shapes():
    with pytest.raises(ValueError, match="share a vocabulary"):
        proxy_teacher_logits(t([[[1.0, 0.0]]]), t([[[1.0]]]), t([[[1.0, 0.0]]]), 1.0)
