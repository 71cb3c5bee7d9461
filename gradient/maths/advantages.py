"""Group advantages of the GRPO family: a ``rewards_P_G`` table -> one advantage per rollout.

Every estimator is registered with ``@register_advantage(name)`` and takes the same
``AdvantageInput``; ``compute_advantages(name, inp)`` dispatches. All of them are
outcome-level: one scalar reward per rollout, one advantage per rollout. The trainer
spreads each rollout's advantage over its generated tokens with
``gradient.maths.losses.token_advantages``.

Row p of ``rewards_P_G`` holds the G rollouts of prompt p; advantages are computed within each
row (the "group"). A group whose rewards are all equal carries no signal and gets exactly 0
(the float mean of equal values can miss them by an ulp, which would leave a spurious
update). The arithmetic is float64; the result has the rewards' dtype if that is floating,
else torch's default float dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from populations.registry import Registry

_ADVANTAGES: Registry[Callable[["AdvantageInput"], torch.Tensor]] = Registry("advantage estimator")


@dataclass(frozen=True)
class AdvantageInput:
    """The one input every advantage estimator takes.

    Raises ValueError unless ``rewards_P_G`` is a finite 2-D tensor with at least one prompt
    and at least two rollouts per prompt: a group of one cannot be centred (verl silently
    gives it mean 0 and std 1, i.e. A = r; here that is treated as a configuration error).
    Rewards a verifier could not score must be resolved before this point (TRL turns them into
    NaN and drops them from the baseline; this module does not).
    """

    # Prompt-by-rollout rewards (larger is better), any real dtype.
    rewards_P_G: torch.Tensor
    # Added to the group std before dividing (``grpo`` only). verl uses 1e-6 (the default);
    # TRL uses 1e-4.
    std_eps: float = 1e-6
    # Bessel-corrected std (divide by G - 1), as TRL and verl; False gives the population std
    # (divide by G), as TraceRL and SLIM-RL.
    unbiased_std: bool = True

    def __post_init__(self):
        r = self.rewards_P_G
        if not isinstance(r, torch.Tensor) or r.dim() != 2 or r.shape[0] == 0:
            raise ValueError(f"rewards_P_G must be a 2-D tensor (prompts x rollouts) with at "
                             f"least one prompt, got {type(r).__name__} of shape "
                             f"{getattr(r, 'shape', None)}")
        if r.shape[1] < 2:
            raise ValueError(f"group advantages need at least 2 rollouts per prompt to centre "
                             f"the rewards, got G = {r.shape[1]}")
        if r.is_complex() or not bool(torch.isfinite(r).all()):
            raise ValueError("rewards_P_G must be real and finite (no NaN or inf)")
        if not (isinstance(self.std_eps, (int, float)) and not isinstance(self.std_eps, bool)
                and 0 <= self.std_eps < math.inf):
            raise ValueError(f"std_eps must be a finite number >= 0, got {self.std_eps!r}")
        if not isinstance(self.unbiased_std, bool):
            raise ValueError(f"unbiased_std must be True or False, got {self.unbiased_std!r}")

    @property
    def out_dtype(self) -> torch.dtype:
        """The dtype of the advantages: the rewards' own if floating, else the default."""
        d = self.rewards_P_G.dtype
        return d if d.is_floating_point else torch.get_default_dtype()


def register_advantage(name: str):
    """Decorator registering ``fn(inp: AdvantageInput) -> adv_P_G`` under ``name``."""
    return _ADVANTAGES.register(name)


def advantage_names() -> list[str]:
    """The registered advantage estimator names, sorted."""
    return _ADVANTAGES.names()


def compute_advantages(name: str, inp: AdvantageInput) -> torch.Tensor:
    """``adv_P_G`` of estimator ``name`` on ``inp``.

    Raises ValueError naming the valid estimators if ``name`` is not registered.
    """
    return _ADVANTAGES.get(name)(inp)


def _centred(inp: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(r_P_G, r - mean, constant_P_1)`` in float64; ``constant`` marks all-equal groups."""
    r_P_G = inp.rewards_P_G.detach().to(torch.float64)
    constant_P_1 = r_P_G.amax(dim=1, keepdim=True) == r_P_G.amin(dim=1, keepdim=True)
    return r_P_G, r_P_G - r_P_G.mean(dim=1, keepdim=True), constant_P_1


def _finish(inp: AdvantageInput, adv_P_G: torch.Tensor, constant_P_1: torch.Tensor):
    return torch.where(constant_P_1, torch.zeros_like(adv_P_G), adv_P_G).to(inp.out_dtype)


@register_advantage("grpo")
def grpo(inp: AdvantageInput) -> torch.Tensor:
    """Group z-scores ``(r - mean_g) / (std_g + std_eps)``, shape ``(P, G)``.

    Shao et al. 2024 (DeepSeekMath, arXiv 2402.03300). The std is Bessel-corrected when
    ``inp.unbiased_std`` (TRL and verl) and the eps is added to the std, not the variance.
    ``std_eps`` = 1e-6 reproduces verl; TRL's "group" scaling is ``std_eps=1e-4``.
    Departure: an all-equal group gives exactly 0 even with ``std_eps`` = 0.
    """
    r_P_G, d_P_G, constant_P_1 = _centred(inp)
    std_P_1 = r_P_G.std(dim=1, correction=1 if inp.unbiased_std else 0, keepdim=True)
    # Constant groups would divide 0 by eps (or by 0); they are overwritten with 0 anyway.
    std_P_1 = torch.where(constant_P_1, torch.ones_like(std_P_1), std_P_1)
    return _finish(inp, d_P_G / (std_P_1 + inp.std_eps), constant_P_1)


@register_advantage("dr_grpo")
def dr_grpo(inp: AdvantageInput) -> torch.Tensor:
    """Group-centred rewards ``r - mean_g`` (no std scaling), shape ``(P, G)``.

    Liu et al. 2025, Dr. GRPO (arXiv 2503.20783): dividing by the group std up-weights
    near-uniform groups (a question bias); this keeps the reward scale. The same advantage is
    used by d1, the Tinker cookbook and GAPO (whose clip schedule assumes A = (k - c)/k for a
    correct rollout of a binary task). ``std_eps`` and ``unbiased_std`` are ignored.
    """
    _, d_P_G, constant_P_1 = _centred(inp)
    return _finish(inp, d_P_G, constant_P_1)


@register_advantage("rloo")
def rloo(inp: AdvantageInput) -> torch.Tensor:
    """Leave-one-out advantages ``r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_g)``, (P, G).

    Ahmadian et al. 2024, RLOO (arXiv 2402.14740); verl's ``rloo`` estimator. Each rollout's
    baseline excludes itself, so the estimate is unbiased. ``std_eps`` and ``unbiased_std``
    are ignored.
    """
    _, d_P_G, constant_P_1 = _centred(inp)
    G = d_P_G.shape[1]
    return _finish(inp, d_P_G * (G / (G - 1)), constant_P_1)
