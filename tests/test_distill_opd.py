"""OPD maths: the sampled-token reverse-KL advantage, the Tinker reward combination and GKD's
generalized JSD, against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.distill.opd import (_categories, combine_with_reward, generalized_jsd,
                                  reverse_kl_advantage)

F64 = torch.float64
LN = math.log


def t(x):
    return torch.tensor(x, dtype=F64)


def test_reverse_kl_advantage_by_hand():
    # A = log pi_T - log pi_S: [-1 - (-2), -3 - (-1)] = [1, -2]; the padded slot is 0 even
    # though it holds NaN.
    s = t([[-2.0, -1.0, float("nan")]])
    te = t([[-1.0, -3.0, 5.0]])
    m = torch.tensor([[1, 1, 0]])
    adv = reverse_kl_advantage(s, te, m)
    assert torch.equal(adv, t([[1.0, -2.0, 0.0]]))


def test_reverse_kl_advantage_is_detached():
    s = t([[-2.0, -1.0]]).requires_grad_()
    adv = reverse_kl_advantage(s, t([[-1.0, -1.0]]), torch.ones(1, 2))
    assert not adv.requires_grad


def test_combine_with_reward_tinker_form():
    # Row 0: 0.5 + 2 * [1, -2] = [2.5, -3.5]; row 1: -0.5 + 2 * [0.25, x(masked)] = [0, 0].
    adv_kl = t([[1.0, -2.0], [0.25, 7.0]])
    m = torch.tensor([[1, 1], [1, 0]])
    out = combine_with_reward(adv_kl, t([0.5, -0.5]), m, kl_coef=2.0)
    assert torch.equal(out, t([[2.5, -3.5], [0.0, 0.0]]))


def test_combine_with_reward_rejects_bad_input():
    with pytest.raises(ValueError, match="reward_adv_B"):
        combine_with_reward(t([[1.0]]), t([1.0, 2.0]), torch.ones(1, 1), 1.0)
    with pytest.raises(ValueError, match="kl_coef"):
        combine_with_reward(t([[1.0]]), t([1.0]), torch.ones(1, 1), -1.0)


# Student S = [1/2, 1/2] (logits 0, 0); teacher T = [3/4, 1/4] (logits ln 3, 0).
S_LOGITS = t([[[0.0, 0.0]]])
T_LOGITS = t([[[LN(3.0), 0.0]]])
ONE = torch.ones(1, 1)
KL_T_S = 0.75 * LN(0.75 / 0.5) + 0.25 * LN(0.25 / 0.5)  # = 0.130812
KL_S_T = 0.5 * LN(0.5 / 0.75) + 0.5 * LN(0.5 / 0.25)  # = 0.143841


def test_jsd_endpoints_are_the_kls():
    fwd = generalized_jsd(S_LOGITS, T_LOGITS, ONE, 0.0)
    rev = generalized_jsd(S_LOGITS, T_LOGITS, ONE, 1.0)
    assert fwd.item() == pytest.approx(KL_T_S, abs=1e-12)
    assert rev.item() == pytest.approx(KL_S_T, abs=1e-12)


def test_jsd_half_by_hand():
    # M = (S + T) / 2 = [5/8, 3/8].
    kl_t_m = 0.75 * LN(0.75 / 0.625) + 0.25 * LN(0.25 / 0.375)  # 0.035375
    kl_s_m = 0.5 * LN(0.5 / 0.625) + 0.5 * LN(0.5 / 0.375)  # 0.032269
    got = generalized_jsd(S_LOGITS, T_LOGITS, ONE, 0.5).item()
    assert got == pytest.approx(0.5 * kl_t_m + 0.5 * kl_s_m, abs=1e-12)
    assert got == pytest.approx(0.033822, abs=1e-6)


def test_jsd_near_endpoints_scales_like_the_kl():
    # JSD_beta ~ beta KL(T||S) as beta -> 0 and ~ (1 - beta) KL(S||T) as beta -> 1.
    eps = 1e-6
    lo = generalized_jsd(S_LOGITS, T_LOGITS, ONE, eps).item() / eps
    hi = generalized_jsd(S_LOGITS, T_LOGITS, ONE, 1 - eps).item() / eps
    assert lo == pytest.approx(KL_T_S, rel=1e-4)
    assert hi == pytest.approx(KL_S_T, rel=1e-4)


def test_temperature_scales_logits():
    # Temperature 2 on logits (2 ln 3, 0) gives the same T = [3/4, 1/4].
    got = generalized_jsd(2 * S_LOGITS, 2 * T_LOGITS, ONE, 1.0, temperature=2.0)
    assert got.item() == pytest.approx(KL_S_T, abs=1e-12)


# Three tokens: teacher T = [0.6, 0.3, 0.1], student uniform.
T3 = t([[[LN(6.0), LN(3.0), 0.0]]])
S3 = t([[[0.0, 0.0, 0.0]]])


def test_top1_tail_bucket_by_hand():
    # Categories {token 0, tail}: T = [0.6, 0.4], S = [1/3, 2/3].
    want = (1 / 3) * LN((1 / 3) / 0.6) + (2 / 3) * LN((2 / 3) / 0.4)
    got = generalized_jsd(S3, T3, ONE, 1.0, top_k=1, tail_bucket=True)
    assert got.item() == pytest.approx(want, abs=1e-12)
    # Renormalised over one token both are [1]: no divergence.
    assert generalized_jsd(S3, T3, ONE, 1.0, top_k=1, tail_bucket=False).item() == 0.0


def test_top2_renormalised_by_hand():
    # T over {0, 1} renormalised = [2/3, 1/3]; S = [1/2, 1/2]; KL(S||T) = 0.5 ln(9/8).
    got = generalized_jsd(S3, T3, ONE, 1.0, top_k=2, tail_bucket=False)
    assert got.item() == pytest.approx(0.5 * LN(0.75) + 0.5 * LN(1.5), abs=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("tail", [True, False])
def test_top_k_equal_to_v_is_full(beta, tail):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 5, generator=g, dtype=F64)
    te = torch.randn(2, 3, 5, generator=g, dtype=F64)
    m = torch.ones(2, 3)
    full = generalized_jsd(s, te, m, beta)
    assert torch.allclose(generalized_jsd(s, te, m, beta, top_k=5, tail_bucket=tail), full)
    assert torch.allclose(generalized_jsd(s, te, m, beta, top_k=9, tail_bucket=tail), full)


def test_tail_bucket_keeps_both_distributions_normalised():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(2, 3, 7, generator=g, dtype=F64).log_softmax(-1)
    te_logits = torch.randn(2, 3, 7, generator=g, dtype=F64)
    s_c, t_c = _categories(s, te_logits.log_softmax(-1), te_logits, 3, True)
    assert s_c.shape == (2, 3, 4)
    assert torch.allclose(s_c.exp().sum(-1), torch.ones(2, 3, dtype=F64))
    assert torch.allclose(t_c.exp().sum(-1), torch.ones(2, 3, dtype=F64))
    # The kept categories are the teacher's top 3, unchanged (not renormalised).
    idx = te_logits.topk(3, dim=-1).indices
    assert torch.allclose(t_c[..., :3], te_logits.log_softmax(-1).gather(-1, idx))


def test_masked_positions_never_matter():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(2, 4, 6, generator=g, dtype=F64)
    te = torch.randn(2, 4, 6, generator=g, dtype=F64)
    m = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    s2, te2 = s.clone(), te.clone()
    s2[m == 0] = float("nan")
    te2[m == 0] = float("inf")
    s.requires_grad_(), s2.requires_grad_()
    for kw in [dict(), dict(top_k=2), dict(top_k=2, tail_bucket=False)]:
        a = generalized_jsd(s, te, m, 0.4, **kw)
        b = generalized_jsd(s2, te2, m, 0.4, **kw)
        assert torch.equal(a, b)
        assert torch.all(b[m == 0] == 0)
        (ga,) = torch.autograd.grad(a.sum(), s)
        (gb,) = torch.autograd.grad(b.sum(), s2)
        assert torch.equal(ga, gb)
        assert torch.all(gb[m == 0] == 0)


@pytest.mark.parametrize("kw", [dict(beta=0.0), dict(beta=0.5), dict(beta=1.0),
                                dict(beta=0.5, top_k=2), dict(beta=1.0, top_k=2, tail_bucket=False),
                                dict(beta=0.2, temperature=0.7)])
def test_gradcheck(kw):
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 2, 4, generator=g, dtype=F64, requires_grad=True)
    te = torch.randn(2, 2, 4, generator=g, dtype=F64)
    m = torch.tensor([[1, 1], [1, 0]])
    beta = kw.pop("beta")
    assert torch.autograd.gradcheck(lambda x: generalized_jsd(x, te, m, beta, **kw), (s,))


def test_teacher_gets_no_gradient():
    te = T_LOGITS.clone().requires_grad_()
    s = S_LOGITS.clone().requires_grad_()
    generalized_jsd(s, te, ONE, 0.5).sum().backward()
    assert te.grad is None and s.grad is not None


def test_jsd_rejects_bad_settings():
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(S_LOGITS, T_LOGITS, ONE, 1.5)
    with pytest.raises(ValueError, match="temperature"):
        generalized_jsd(S_LOGITS, T_LOGITS, ONE, 0.5, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        generalized_jsd(S_LOGITS, T_LOGITS, ONE, 0.5, top_k=0)
    with pytest.raises(ValueError, match="same shape"):
        generalized_jsd(S_LOGITS, T3, ONE, 0.5)
