"""Functional ascent optimizers: hand values, torch.optim.Adam(maximize=True) as reference,
and anchored weight decay toward theta0."""

from __future__ import annotations

import pytest
import torch

from populations.optimizers import OptimizerConfig, make_optimizer, optimizer_names


def params():
    return {"w": torch.tensor([[1.0, -2.0], [0.5, 0.0]]), "b": torch.tensor([3.0, -1.0, 0.25])}


def grads_at(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return {k: torch.randn(v.shape, generator=g) for k, v in params().items()}


def test_registry():
    assert optimizer_names() == ["adam", "sgd"]
    with pytest.raises(ValueError, match="adam, sgd"):
        OptimizerConfig("rmsprop")


def test_sgd_ascends_by_hand():
    # theta' = theta + lr g: [3, -1, 0.25] + 0.5 [2, 0, -1] = [4, -1, -0.25].
    opt = make_optimizer(OptimizerConfig("sgd", lr=0.5))
    p = {"b": torch.tensor([3.0, -1.0, 0.25])}
    new, state = opt.update({"b": torch.tensor([2.0, 0.0, -1.0])}, opt.init(p), p)
    assert new["b"].tolist() == [4.0, -1.0, -0.25]
    assert state.count == 1


def test_first_adam_step_is_lr_times_the_sign():
    # Step 1: m = (1-b1) g, v = (1-b2) g^2, so m_hat = g and v_hat = g^2, and
    # u = g / (|g| + eps) = sign(g) up to eps; with lr = 0.1, theta' = theta + 0.1 sign(g).
    opt = make_optimizer(OptimizerConfig("adam", lr=0.1))
    p = {"b": torch.tensor([3.0, -1.0, 0.25])}
    new, _ = opt.update({"b": torch.tensor([2.0, -0.001, 5.0])}, opt.init(p), p)
    assert torch.allclose(new["b"], torch.tensor([3.1, -1.1, 0.35]), atol=1e-6)


@pytest.mark.parametrize("betas, eps", [((0.9, 0.999), 1e-8), ((0.5, 0.9), 1e-3)])
def test_adam_matches_torch_adam_maximizing(betas, eps):
    cfg = OptimizerConfig("adam", lr=0.05, betas=betas, eps=eps)
    opt = make_optimizer(cfg)
    ours = params()
    state = opt.init(ours)
    ref = {k: v.clone().requires_grad_(True) for k, v in params().items()}
    torch_opt = torch.optim.Adam(list(ref.values()), lr=0.05, betas=betas, eps=eps,
                                 maximize=True)
    for step in range(6):
        g = grads_at(step)
        ours, state = opt.update(g, state, ours)
        for k, v in ref.items():
            v.grad = g[k].clone()
        torch_opt.step()
        for k in ours:
            assert torch.allclose(ours[k], ref[k].detach(), rtol=1e-6, atol=1e-6), (step, k)
    assert state.count == 6


def test_update_is_pure():
    opt = make_optimizer(OptimizerConfig("adam", lr=0.1, anchor_decay=0.1))
    p, g = params(), grads_at(0)
    state = opt.init(p)
    snapshot = ({k: v.clone() for k, v in p.items()},
                {k: {s: t.clone() for s, t in d.items()} for k, d in state.slots.items()})
    opt.update(g, state, p)
    assert all(torch.equal(p[k], snapshot[0][k]) for k in p)
    assert all(torch.equal(state.slots[k][s], snapshot[1][k][s])
               for k in state.slots for s in state.slots[k])
    assert state.count == 0


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_anchored_decay_pulls_toward_theta0(name):
    # theta0 = [1, -2]; after moving theta to [3, 0], a zero gradient leaves only the decay:
    # theta' - theta0 = (1 - lr lambda) (theta - theta0) = (1 - 0.1 * 0.5) [2, 2] = 0.95 [2, 2],
    # so theta' = [2.9, -0.1]. Plain weight decay would have pulled toward 0 instead:
    # 0.95 [3, 0] = [2.85, 0].
    opt = make_optimizer(OptimizerConfig(name, lr=0.1, anchor_decay=0.5))
    theta0 = {"w": torch.tensor([1.0, -2.0])}
    state = opt.init(theta0)
    moved = {"w": torch.tensor([3.0, 0.0])}
    zero = {"w": torch.zeros(2)}
    new, state = opt.update(zero, state, moved)
    assert torch.allclose(new["w"], torch.tensor([2.9, -0.1]), atol=1e-6)
    assert torch.equal(state.slots["w"]["anchor"], theta0["w"])  # the anchor never moves


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_theta0_is_a_fixed_point_without_signal(name):
    opt = make_optimizer(OptimizerConfig(name, lr=0.1, anchor_decay=0.5))
    p = params()
    state = opt.init(p)
    zero = {k: torch.zeros_like(v) for k, v in p.items()}
    cur = p
    for _ in range(3):
        cur, state = opt.update(zero, state, cur)
    assert all(torch.equal(cur[k], p[k]) for k in p)


def test_anchor_only_kept_when_decay_is_on():
    p = params()
    assert "anchor" not in make_optimizer(OptimizerConfig("adam")).init(p).slots["w"]
    assert set(make_optimizer(OptimizerConfig("adam", anchor_decay=0.1)).init(p).slots["w"]) \
        == {"m", "v", "anchor"}


def test_low_precision_params_and_mismatched_names_are_rejected():
    opt = make_optimizer(OptimizerConfig("sgd"))
    with pytest.raises(ValueError, match="float32"):
        opt.init({"w": torch.zeros(2, dtype=torch.bfloat16)})
    p = params()
    with pytest.raises(ValueError, match="same tensors"):
        opt.update({"w": torch.zeros(2, 2)}, opt.init(p), p)


@pytest.mark.parametrize("bad", [dict(lr=0.0), dict(lr=float("nan")), dict(betas=(1.0, 0.9)),
                                 dict(eps=0.0), dict(anchor_decay=-0.1)])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        OptimizerConfig("adam", **bad)
