"""Functional optimizers for gradient *ascent* over ``dict[str, Tensor]`` fp32 parameter sets.

In the optax style: ``opt = make_optimizer(cfg)``, ``state = opt.init(params)``,
``params, state = opt.update(grads, state, params)``. Nothing is mutated; every call returns
new tensors and a new state, so the same inputs give bitwise the same outputs.

Sign convention: ``grads`` is an *ascent* direction (the ES estimate of the gradient of the
reward), and every rule moves parameters along it: for SGD ``theta += lr * g``. Pass a
loss gradient negated.

Each registered rule maps one tensor's ``TensorStep`` to a unit step ``u`` (``g`` for SGD, the
bias-corrected ``m / (sqrt(v) + eps)`` for Adam); the shared update is then

    theta' = theta + lr * u - lr * anchor_decay * (theta - theta0)

The last term is anchored weight decay (Schweighofer et al. 2026; decoupled as in AdamW,
Loshchilov & Hutter 2019, but pulling toward the initial weights theta0 instead of 0, so
it limits drift from the base model without shrinking it). theta0 is stored in the state
when ``anchor_decay > 0``.

Departure from the source's code: it shrinks the displacement after adding the step,
theta' = theta0 + (1 - lr * lambda) * (theta + lr * u - theta0); here the pre-step
displacement is decayed (as AdamW does), which differs by lr^2 * anchor_decay * u, second
order in lr. Its shipped run pulls by lr * lambda = 5e-4 * 10 = 0.5% of the displacement per
iteration; es-llm's ES configs (lr 0.005) get the same pull at ``anchor_decay = 1.0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple

import torch

from populations.numbers import is_finite_number
from populations.registry import Registry
from populations.settings import SettingError, check_choices, choice

Params = Mapping[str, torch.Tensor]


class _Rule(NamedTuple):
    slots: tuple[str, ...]
    step: Callable[["TensorStep"], tuple[torch.Tensor, dict[str, torch.Tensor]]]


_RULES: Registry[_Rule] = Registry("optimizer")


@dataclass(frozen=True)
class OptimizerConfig:
    """Which optimizer and its hyperparameters; validated on construction (``SettingError``,
    a ValueError). ``es.ESConfig`` extends it, so these are flat keys of a run's ``es``."""

    # Optimizer on the estimate: sgd or adam.
    optimizer: str = choice("sgd", lambda: optimizer_names())
    # Step size alpha of the update (the 1/sigma of the textbook estimator is folded in, as in
    # Qiu et al. 2025: theta += alpha / N * sum_n z_n eps_n; they use alpha = sigma / 2).
    lr: float = 5e-4
    # Adam's decay rates of the first and second moment estimates.
    betas: tuple[float, float] = (0.9, 0.999)
    # Adam's denominator term, added to sqrt(v_hat).
    eps: float = 1e-8
    # Weight decay toward the initial weights: a pull of lr * anchor_decay * (theta - theta0)
    # per step (0 = off).
    anchor_decay: float = 0.0

    def __post_init__(self):
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))
        check_choices(self)
        if not (is_finite_number(self.lr) and self.lr > 0):
            raise SettingError("lr", f"lr must be a positive number, got {self.lr!r}")
        if not (len(self.betas) == 2 and all(is_finite_number(b) and 0 <= b < 1 for b in self.betas)):
            raise SettingError("betas", f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (is_finite_number(self.eps) and self.eps > 0):
            # eps = 0 would make Adam's 0 / 0 a NaN wherever a gradient stays exactly 0.
            raise SettingError("eps", f"eps must be a positive number, got {self.eps!r}")
        if not (is_finite_number(self.anchor_decay) and self.anchor_decay >= 0):
            raise SettingError("anchor_decay", f"anchor_decay must be a number >= 0, got "
                                               f"{self.anchor_decay!r}")


@dataclass(frozen=True)
class OptimizerState:
    """``count``: updates applied so far; ``slots[name]``: that tensor's fp32 buffers
    (e.g. ``m``, ``v``, and ``anchor`` = theta0 when anchored decay is on)."""

    count: int
    slots: Mapping[str, Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class TensorStep:
    """The one input every rule takes: one tensor's ascent direction ``grad``, current
    ``param``, its ``slots`` and the 1-based number ``count`` of this update."""

    cfg: OptimizerConfig
    grad: torch.Tensor
    param: torch.Tensor
    slots: Mapping[str, torch.Tensor]
    count: int


def register_optimizer(name: str, slots: tuple[str, ...] = ()):
    """Decorator registering a rule ``fn(TensorStep) -> (u, new_slots)`` under ``name``;
    ``slots`` names the zero-initialised fp32 buffers it keeps per tensor."""

    def decorator(fn):
        _RULES.register(name)(_Rule(tuple(slots), fn))
        return fn

    return decorator


def optimizer_names() -> list[str]:
    """The registered optimizer names, sorted."""
    return _RULES.names()


@register_optimizer("sgd")
def sgd(inp: TensorStep) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Plain ascent, ``u = g`` (Qiu et al. 2025 use exactly this, with no momentum)."""
    return inp.grad, {}


@register_optimizer("adam", slots=("m", "v"))
def adam(inp: TensorStep) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Adam (Kingma & Ba 2015, Alg. 1) for ascent: ``u = m_hat / (sqrt(v_hat) + eps)`` with
    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2`` and bias corrections
    ``m_hat = m / (1 - b1^t)``, ``v_hat = v / (1 - b2^t)``. Equals ``torch.optim.Adam`` with
    ``maximize=True`` up to float rounding."""
    b1, b2 = inp.cfg.betas
    g, t = inp.grad, inp.count
    m = inp.slots["m"] * b1 + g * (1 - b1)
    v = inp.slots["v"] * b2 + g * g * (1 - b2)
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    return m_hat / (v_hat.sqrt() + inp.cfg.eps), {"m": m, "v": v}


def _check_fp32(params: Params, what: str) -> None:
    bad = sorted(k for k, v in params.items() if v.dtype != torch.float32)
    if bad:
        raise ValueError(f"{what} must be float32 (keep an fp32 master copy; low-precision "
                         f"updates round to zero), offending tensors: {bad[:5]}")


def _init(cfg: OptimizerConfig, params: Params) -> OptimizerState:
    _check_fp32(params, "params")
    rule = _RULES.get(cfg.optimizer)
    slots = {}
    for name, p in params.items():
        s = {k: torch.zeros_like(p) for k in rule.slots}
        if cfg.anchor_decay > 0:
            s["anchor"] = p.detach().clone()
        slots[name] = s
    return OptimizerState(0, slots)


def _update(cfg: OptimizerConfig, grads: Params, state: OptimizerState,
            params: Params) -> tuple[dict[str, torch.Tensor], OptimizerState]:
    mismatched = (set(grads) ^ set(params)) | (set(state.slots) ^ set(params))
    if mismatched:
        raise ValueError("grads, params and the optimizer state must name the same tensors; "
                         f"mismatched names: {sorted(mismatched)[:5]}")
    _check_fp32(params, "params")
    _check_fp32(grads, "grads")
    rule, count = _RULES.get(cfg.optimizer), state.count + 1
    new_params, new_slots = {}, {}
    for name, p in params.items():
        slots = state.slots[name]
        u, s = rule.step(TensorStep(cfg, grads[name], p, slots, count))
        new = p + cfg.lr * u
        if cfg.anchor_decay > 0:
            # Decay uses the pre-step theta, as AdamW does, so theta0 is an exact fixed point
            # when the gradient is 0.
            new = new - (cfg.lr * cfg.anchor_decay) * (p - slots["anchor"])
            s = {**s, "anchor": slots["anchor"]}
        new_params[name], new_slots[name] = new, s
    return new_params, OptimizerState(count, new_slots)


class Optimizer(NamedTuple):
    """``init(params) -> state`` and ``update(grads, state, params) -> (params, state)``."""

    init: Callable[[Params], OptimizerState]
    update: Callable[[Params, OptimizerState, Params],
                     tuple[dict[str, torch.Tensor], OptimizerState]]


def make_optimizer(cfg: OptimizerConfig) -> Optimizer:
    """The optimizer ``cfg`` describes, as a pair of pure functions bound to ``cfg``."""

    def init(params: Params) -> OptimizerState:
        return _init(cfg, params)

    def update(grads: Params, state: OptimizerState, params: Params):
        return _update(cfg, grads, state, params)

    return Optimizer(init, update)
