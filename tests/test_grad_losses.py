"""Policy losses against hand values, a sequence-level reference, and gradcheck."""

from __future__ import annotations

import math

import pytest
import torch

from gradient.maths.aggregation import aggregate
from gradient.maths.losses import (LossInput, compute_loss, gapo_clip_high, gapo_eps_hi, loss_names,
                             token_advantages)

F64 = torch.float64
METRICS = {"clipfrac", "clipfrac_low", "clipfrac_high", "dualclipfrac", "ratio_mean", "approx_kl"}


def make(log_ratio, adv, mask=None, old=None, **kw) -> LossInput:
    """A LossInput with ``logp = old + log_ratio`` (old = 0 unless given), float64, and
    logp a leaf that requires grad."""
    log_ratio = torch.as_tensor(log_ratio, dtype=F64)
    old = torch.zeros_like(log_ratio) if old is None else torch.as_tensor(old, dtype=F64)
    logp = (old + log_ratio).detach().requires_grad_(True)
    adv = torch.as_tensor(adv, dtype=F64)
    mask = torch.ones_like(log_ratio) if mask is None else torch.as_tensor(mask, dtype=F64)
    kw.setdefault("clip_low", 0.2)
    kw.setdefault("clip_high", 0.28)
    return LossInput(logp, old, adv, mask, **kw)


def loss_and_grad(name: str, inp: LossInput):
    loss, metrics = compute_loss(name, inp)
    (grad,) = torch.autograd.grad(loss.sum(), inp.logp_B_T)
    return loss.detach(), grad, metrics


def L(*ratios):
    return [[math.log(r) for r in ratios]]


def test_registry_holds_the_three_losses():
    assert loss_names() == ["gapo", "gspo", "ppo_clip"]


def test_ppo_clip_by_hand():
    # clip [0.8, 1.28]. Per token, L = max(-A r, -A clip(r)) and dL/dlogp = -A r when the
    # unclipped branch wins, else 0:
    #   r = 1.5, A = +1: max(-1.5, -1.28) = -1.28, clipped high, grad 0
    #   r = 0.5, A = +1: max(-0.5, -0.8)  = -0.5,  unclipped,    grad -0.5
    #   r = 0.5, A = -1: max(0.5, 0.8)    =  0.8,  clipped low,  grad 0
    #   r = 1.5, A = -1: max(1.5, 1.28)   =  1.5,  unclipped,    grad 1.5
    loss, grad, m = loss_and_grad("ppo_clip", make(L(1.5, 0.5, 0.5, 1.5), [[1, 1, -1, -1]]))
    assert torch.allclose(loss, torch.tensor([[-1.28, -0.5, 0.8, 1.5]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[0.0, -0.5, 0.0, 1.5]], dtype=F64))
    assert m["clipfrac"] == 0.5 and m["clipfrac_low"] == 0.25 and m["clipfrac_high"] == 0.25
    assert m["dualclipfrac"] == 0.0
    assert torch.isclose(m["ratio_mean"], torch.tensor(1.0, dtype=F64))
    # approx_kl = mean(r - 1 - log r): r = 1.5 gives 0.5 - 0.405465 = 0.094535, r = 0.5 gives
    # -0.5 + 0.693147 = 0.193147; mean over the four tokens 0.143841.
    k = (0.5 - math.log(1.5) - 0.5 - math.log(0.5)) / 2
    assert math.isclose(float(m["approx_kl"]), k, rel_tol=1e-12)


def test_clip_higher_is_asymmetric():
    # Both ratios are 0.25 from 1. With (0.2, 0.28): r = 1.25, A = +1 is inside (< 1.28), so
    # L = -1.25 with grad -1.25; r = 0.75, A = -1 is below 0.8: L = 0.8, grad 0.
    loss, grad, m = loss_and_grad("ppo_clip", make(L(1.25, 0.75), [[1, -1]]))
    assert torch.allclose(loss, torch.tensor([[-1.25, 0.8]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[-1.25, 0.0]], dtype=F64))
    assert m["clipfrac_high"] == 0.0 and m["clipfrac_low"] == 0.5
    # Symmetric 0.2: r = 1.25 is now clipped at 1.2, L = -1.2, grad 0.
    loss, grad, _ = loss_and_grad("ppo_clip", make(L(1.25, 0.75), [[1, -1]], clip_high=0.2))
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8]], dtype=F64))
    assert grad.tolist() == [[0.0, 0.0]]


def test_dual_clip_caps_negative_advantages_only():
    # r = 5, A = -1: max(5, 1.28) = 5, capped at c|A| = 3 with grad 0 (without the cap the
    # grad is -A r = 5). r = 2, A = -1: 2 < 3, untouched, grad 2. r = 5, A = +1: clipped high
    # at -1.28 either way.
    ratios, advs = L(5.0, 2.0, 5.0), [[-1, -1, 1]]
    loss, grad, m = loss_and_grad("ppo_clip", make(ratios, advs, dual_clip=3.0))
    assert torch.allclose(loss, torch.tensor([[3.0, 2.0, -1.28]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[0.0, 2.0, 0.0]], dtype=F64))
    assert math.isclose(float(m["dualclipfrac"]), 1 / 3)
    loss, grad, _ = loss_and_grad("ppo_clip", make(ratios, advs))
    assert torch.allclose(loss, torch.tensor([[5.0, 2.0, -1.28]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[5.0, 2.0, 0.0]], dtype=F64))


def test_extreme_ratios_stay_finite():
    # log r = 100 is clamped to 20 before exp: with A = -1 the loss is e^20 and, past the
    # clamp, carries no gradient; the dual clip caps it at 3. approx_kl uses the same clamp.
    for dual, value in ((None, math.exp(20)), (3.0, 3.0)):
        loss, grad, m = loss_and_grad("ppo_clip", make([[100.0]], [[-1]], dual_clip=dual))
        assert torch.isclose(loss, torch.tensor([[value]], dtype=F64)) and grad.tolist() == [[0.0]]
        assert math.isclose(float(m["approx_kl"]), math.exp(20) - 21)
    loss, grad, m = loss_and_grad("gspo", make([[100.0, 100.0]], [[-1, -1]]))
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert torch.isclose(m["ratio_mean"], torch.tensor(math.exp(10), dtype=F64))


def test_importance_weight_scales_loss_and_gradient():
    # The two unclipped tokens of the hand case, weighted 2 and 0.5.
    w = torch.tensor([[2.0, 0.5]], dtype=F64, requires_grad=True)
    loss, grad, _ = loss_and_grad("ppo_clip", make(L(0.5, 1.5), [[1, -1]], is_weight_B_T=w))
    assert torch.allclose(loss, torch.tensor([[-1.0, 0.75]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[-1.0, 0.75]], dtype=F64))


def test_gspo_uses_the_sequence_ratio_at_every_token():
    # Row 0: log-ratios [0.1, 0.3] (third token masked) -> mean 0.2, s = e^0.2 = 1.221403;
    # A = +1 and s < 1.28: L = -s at both tokens, grad -A s = -s at each (GSPO-token form).
    # Row 1: log-ratios [-0.5, -0.3, -0.4] -> mean -0.4, s = e^-0.4 = 0.670320; A = -1 and
    # s < 0.8: clipped low, L = 0.8, grad 0.
    inp = make([[0.1, 0.3, 0.0], [-0.5, -0.3, -0.4]], [[1, 1, 1], [-1, -1, -1]],
               mask=[[1, 1, 0], [1, 1, 1]])
    loss, grad, m = loss_and_grad("gspo", inp)
    s0, s1 = math.exp(0.2), math.exp(-0.4)
    assert torch.allclose(loss, torch.tensor([[-s0, -s0, 0.0], [0.8, 0.8, 0.8]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[-s0, -s0, 0.0], [0.0, 0.0, 0.0]], dtype=F64))
    assert math.isclose(float(m["clipfrac"]), 3 / 5)
    assert math.isclose(float(m["ratio_mean"]), (2 * s0 + 3 * s1) / 5)
    # The token-level loss sees different ratios on the same row.
    tok, _, _ = loss_and_grad("ppo_clip", inp)
    assert not torch.allclose(tok[0, :2], loss[0, :2])


def gspo_reference(logp_B_T, old_B_T, adv_B, mask_B_T, lo, hi_B):
    """GSPO written at sequence level with a full graph: mean over rows of
    max(-A s_i, -A clip(s_i, lo, hi_i)), s_i = exp(masked mean of logp - old)."""
    s_B = torch.exp(((logp_B_T - old_B_T) * mask_B_T).sum(1) / mask_B_T.sum(1))
    clipped_B = torch.minimum(torch.maximum(s_B, torch.full_like(s_B, lo)), hi_B)
    return torch.maximum(-adv_B * s_B, -adv_B * clipped_B).mean()


@pytest.mark.parametrize("name", ["gspo", "gapo"])
def test_sequence_losses_equal_gspo_under_seq_mean_token_mean(name):
    # With one advantage per row, the GSPO-token loss aggregated by seq-mean-token-mean has
    # GSPO's value and gradient; rows of different lengths make the length handling matter.
    g = torch.Generator().manual_seed(1)
    B, T = 4, 6
    old = torch.randn(B, T, generator=g, dtype=F64)
    logp = (old + 0.3 * torch.randn(B, T, generator=g, dtype=F64)).requires_grad_(True)
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0], [1, 1, 0, 0, 0, 0]], dtype=F64)
    adv_B = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=F64)
    hi_B = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    inp = LossInput(logp, old, token_advantages(adv_B, mask), mask, clip_low=0.1, clip_high=0.2,
                    clip_high_B=hi_B if name == "gapo" else None)
    loss, _ = compute_loss(name, inp)
    got = aggregate(loss, mask, "seq-mean-token-mean", global_tokens=16.0, global_seqs=4.0)
    hi = 1 + (hi_B if name == "gapo" else torch.full((B,), 0.2, dtype=F64))
    ref = gspo_reference(logp, old, adv_B, mask, 0.9, hi)
    assert torch.allclose(got, ref, rtol=1e-12)
    g_got, = torch.autograd.grad(got, logp)
    g_ref, = torch.autograd.grad(ref, logp)
    assert torch.allclose(g_got, g_ref, rtol=1e-10, atol=1e-14)


def test_gapo_bounds_each_row_separately():
    # Both rows have s = e^0.2 = 1.2214 and A = +1. Row 0 may go to 1.1: clipped, L = -1.1,
    # grad 0. Row 1 may go to 1.3: unclipped, L = -1.2214, grad -1.2214 per token.
    hi_B = torch.tensor([0.1, 0.3], dtype=F64)
    inp = make([[0.2, 0.2], [0.1, 0.3]], [[1, 1], [1, 1]], clip_high_B=hi_B)
    loss, grad, m = loss_and_grad("gapo", inp)
    s = math.exp(0.2)
    assert torch.allclose(loss, torch.tensor([[-1.1, -1.1], [-s, -s]], dtype=F64))
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0], [-s, -s]], dtype=F64))
    assert m["clipfrac_high"] == 0.5
    # gapo is gspo when every row gets the scalar width; without the rows it refuses.
    flat = make([[0.2, 0.2], [0.1, 0.3]], [[1, 1], [1, 1]], clip_high_B=torch.full((2,), 0.28))
    assert torch.equal(compute_loss("gapo", flat)[0], compute_loss("gspo", make(
        [[0.2, 0.2], [0.1, 0.3]], [[1, 1], [1, 1]]))[0])
    with pytest.raises(ValueError, match="clip_high_B"):
        compute_loss("gapo", make([[0.2]], [[1]]))


def test_token_level_gapo_variant_is_ppo_clip_with_row_bounds():
    # r = 1.25, A = +1 on two rows with widths 0.2 and 0.3: clipped at 1.2, free below 1.3.
    loss, _, _ = loss_and_grad("ppo_clip", make(L(1.25) * 2, [[1], [1]],
                                                clip_high_B=torch.tensor([0.2, 0.3])))
    assert torch.allclose(loss, torch.tensor([[-1.2], [-1.25]], dtype=F64))


def test_gapo_clip_high_by_hand():
    # eps_hi(c) = 0.2 + (0.5 - 0.2)(4 - c)/3 for k = 4: c = 1..4 -> 0.5, 0.4, 0.3, 0.2; c = 0
    # is clamped to 1.
    eps = gapo_eps_hi(torch.tensor([0, 1, 2, 3, 4]), 4, 0.2, 0.5)
    assert torch.allclose(eps, torch.tensor([0.5, 0.5, 0.4, 0.3, 0.2], dtype=F64), atol=1e-15)
    correct = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    expected = torch.tensor([[0.5, 0.2, 0.2, 0.2],   # c = 1: the lone success gets 0.5
                             [0.4, 0.4, 0.2, 0.2],   # c = 2
                             [0.2, 0.3, 0.3, 0.3],   # c = 3; the failure keeps eps_lo
                             [0.2, 0.2, 0.2, 0.2],   # c = 4 = k: eps_lo
                             [0.2, 0.2, 0.2, 0.2]],  # c = 0: no correct rollout
                            dtype=F64)
    assert torch.allclose(gapo_clip_high(correct, 0.2, 0.5), expected, atol=1e-15)
    assert torch.equal(gapo_clip_high(correct.bool(), 0.2, 0.5), gapo_clip_high(correct, 0.2, 0.5))
    with pytest.raises(ValueError, match="0 and 1"):
        gapo_clip_high(torch.tensor([[0.5, 1.0]]), 0.2, 0.5)
    with pytest.raises(ValueError, match="eps_lo <= eps_hi_max"):
        gapo_eps_hi(torch.tensor([1]), 4, 0.5, 0.2)
    with pytest.raises(ValueError, match="k"):
        gapo_eps_hi(torch.tensor([1]), 1, 0.2, 0.5)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gapo"])
def test_masked_garbage_changes_nothing(name):
    g = torch.Generator().manual_seed(0)
    B, T = 3, 5
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=F64)
    old = torch.randn(B, T, generator=g, dtype=F64) - 2
    log_ratio = 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, T, generator=g, dtype=F64)
    w = torch.rand(B, T, generator=g, dtype=F64) + 0.5
    off = mask == 0

    def run(garbage: bool):
        def fill(x, value):
            return torch.where(off, torch.full_like(x, value), x) if garbage else x
        logp = fill(old + log_ratio, 1e4).requires_grad_(True)
        inp = LossInput(logp, fill(old, -1e4), fill(adv, 1e6), mask, clip_low=0.2, clip_high=0.28,
                        dual_clip=3.0, clip_high_B=torch.tensor([0.1, 0.2, 0.3]),
                        is_weight_B_T=fill(w, 1e6))
        loss, metrics = compute_loss(name, inp)
        (grad,) = torch.autograd.grad(loss.sum(), logp)
        return loss.detach(), grad, metrics

    clean, garbage = run(False), run(True)
    assert torch.equal(clean[0], garbage[0]) and torch.equal(clean[1], garbage[1])
    assert all(torch.equal(clean[2][k], garbage[2][k]) for k in METRICS)
    assert torch.all(garbage[0][off] == 0) and torch.all(garbage[1][off] == 0)
    assert torch.isfinite(garbage[0]).all() and torch.isfinite(garbage[1]).all()


def test_ppo_clip_gradcheck():
    # Tokens inside the clip range (|log r| = 0.05) and outside it (0.5), both signs of A,
    # a dual-clipped token (log r = 1.5 > log 3 with A < 0), a masked one, IS weights.
    log_ratio = torch.tensor([[0.05, -0.05, 0.5, -0.5], [1.5, 0.5, -0.5, 0.0]], dtype=F64)
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.5, -0.7, -2.2, -0.1]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0], [-1.0, -2.0, 2.0, 0.5]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=F64)
    w = torch.tensor([[1.0, 0.5, 2.0, 1.5], [1.0, 0.8, 1.2, 3.0]], dtype=F64)
    logp = (old + log_ratio).requires_grad_(True)

    def f(lp):
        inp = LossInput(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0,
                        is_weight_B_T=w)
        return compute_loss("ppo_clip", inp)[0]

    assert torch.autograd.gradcheck(f, (logp,))


@pytest.mark.parametrize("name", ["gspo", "gapo"])
def test_sequence_losses_gradcheck(name):
    # The GSPO-token gradient is the gradient of the sequence objective only after
    # seq-mean-token-mean with one advantage per row (see the gspo docstring), so that is
    # what gradcheck differentiates numerically. Row means of the log-ratio: 0.05 (inside),
    # 0.5 (outside, A > 0: clipped), -0.5 (outside, A > 0: free), 0.02 (inside, A < 0).
    log_ratio = torch.tensor([[0.0, 0.1, 0.05], [0.4, 0.6, 9.0], [-0.5, -0.5, -0.5],
                              [0.02, 0.02, 0.02]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=F64)
    old = -torch.arange(12, dtype=F64).reshape(4, 3) / 7
    adv = token_advantages(torch.tensor([1.0, 1.0, 2.0, -1.0], dtype=F64), mask)
    hi_B = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64) if name == "gapo" else None
    logp = (old + log_ratio).requires_grad_(True)

    def f(lp):
        inp = LossInput(lp, old, adv, mask, clip_low=0.2, clip_high=0.28, clip_high_B=hi_B)
        return aggregate(compute_loss(name, inp)[0], mask, "seq-mean-token-mean",
                         global_tokens=9.0, global_seqs=4.0)

    assert torch.autograd.gradcheck(f, (logp,))


def test_inputs_other_than_logp_get_no_gradient_and_metrics_are_detached():
    inp = make(L(1.1, 0.9), [[1, -1]])
    old = inp.old_logp_B_T.clone().requires_grad_(True)
    adv = inp.adv_B_T.clone().requires_grad_(True)
    w = torch.ones(1, 2, dtype=F64, requires_grad=True)
    hi = torch.full((1,), 0.3, dtype=F64, requires_grad=True)
    inp = LossInput(inp.logp_B_T, old, adv, inp.mask_B_T, clip_low=0.2, clip_high=0.28,
                    clip_high_B=hi, is_weight_B_T=w)
    for name in loss_names():
        loss, metrics = compute_loss(name, inp)
        assert set(metrics) == METRICS
        assert not any(v.requires_grad for v in metrics.values())
        loss.sum().backward()
    assert all(t.grad is None for t in (old, adv, w, hi)) and inp.logp_B_T.grad is not None


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="clip_low"):
        make([[0.0]], [[1]], clip_low=-0.1)
    with pytest.raises(ValueError, match="clip_low"):
        make([[0.0]], [[1]], clip_low=1.5)
    with pytest.raises(ValueError, match="clip_high"):
        make([[0.0]], [[1]], clip_high=-0.1)
    with pytest.raises(ValueError, match="empty"):
        make([[0.0]], [[1]], clip_low=0.0, clip_high=0.0)
    with pytest.raises(ValueError, match="dual_clip"):
        make([[0.0]], [[1]], dual_clip=1.0)
    with pytest.raises(ValueError, match="adv_B_T"):
        make([[0.0, 0.0]], [[1]])
    with pytest.raises(ValueError, match="clip_high_B"):
        make([[0.0]], [[1]], clip_high_B=torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="gapo, gspo, ppo_clip"):
        compute_loss("grpo", make([[0.0]], [[1]]))
    with pytest.raises(ValueError, match="adv_B"):
        token_advantages(torch.ones(3), torch.ones(2, 4))
