"""Per-token estimators of KL(pi_theta || pi_ref) from the log-probs of sampled tokens.

Every estimator is registered with ``@register_kl(name)`` and takes the same ``KLInput``;
``kl_estimate(name, logp_B_T, ref_logp_B_T)`` dispatches. Following Schulman's note
"Approximating KL divergence" (2020) and verl's ``kl_penalty``, with
``x = ref_logp - logp = log(pi_ref / pi_theta)`` on a token sampled from pi_theta:

- ``k1 = -x``: unbiased value (high variance, can be negative); its gradient ``grad logp``
  has expectation 0, so as a loss it does nothing on average.
- ``k2 = x^2 / 2``: biased value (a second-order approximation); its gradient
  ``(logp - ref) grad logp`` is an unbiased estimate of grad KL(pi_theta || pi_ref).
- ``k3 = exp(x) - x - 1``: unbiased, non-negative, low-variance value; its gradient
  ``(1 - pi_ref / pi_theta) grad logp`` is unbiased for the *forward* KL(pi_ref || pi_theta)
  instead, i.e. biased for the reverse KL it is meant to penalise.
- ``k3_st``: the value of k3 with the gradient of k2 (straight-through): unbiased in both.

"k3+" is an alias of ``k3_st`` (verl's name). These statements hold when the tokens are
sampled from the current policy; with tokens from an older behaviour policy the estimate
needs an importance weight (TRL's ``use_bias_correction_kl``), which the caller applies.
Results have shape ``(B, T)``; masking and reduction are the caller's (``aggregate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from populations.registry import Registry

_KLS: Registry[Callable[["KLInput"], torch.Tensor]] = Registry("KL estimator")


@dataclass(frozen=True)
class KLInput:
    """The one input every KL estimator takes. Raises ValueError unless both are floating
    tensors of the same shape."""

    # Log-probs of the sampled tokens under the policy being trained (requires grad).
    logp_B_T: torch.Tensor
    # Log-probs of the same tokens under the reference (anchor) policy; detached here.
    ref_logp_B_T: torch.Tensor

    def __post_init__(self):
        a, b = self.logp_B_T, self.ref_logp_B_T
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype.is_floating_point and b.dtype.is_floating_point):
            raise ValueError("logp_B_T and ref_logp_B_T must be floating tensors")
        if a.shape != b.shape:
            raise ValueError(f"logp_B_T {tuple(a.shape)} and ref_logp_B_T {tuple(b.shape)} must "
                             f"have the same shape")

    def log_ratio(self) -> torch.Tensor:
        """``logp - ref_logp`` (the reference is detached)."""
        return self.logp_B_T - self.ref_logp_B_T.detach().to(self.logp_B_T.dtype)


def register_kl(name: str):
    """Decorator registering ``fn(inp: KLInput) -> kl_B_T`` under ``name``."""
    return _KLS.register(name)


def kl_names() -> list[str]:
    """The registered KL estimator names, sorted."""
    return _KLS.names()


def kl_estimate(name: str, logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor) -> torch.Tensor:
    """``kl_B_T`` of estimator ``name``; raises ValueError naming the valid ones if unknown."""
    return _KLS.get(name)(KLInput(logp_B_T, ref_logp_B_T))


@register_kl("k1")
def k1(inp: KLInput) -> torch.Tensor:
    """``logp - ref_logp``, shape ``(B, T)``: unbiased value, useless gradient (see module)."""
    return inp.log_ratio()


@register_kl("k2")
def k2(inp: KLInput) -> torch.Tensor:
    """``(logp - ref_logp)^2 / 2``, shape ``(B, T)``: biased value, unbiased gradient."""
    return 0.5 * inp.log_ratio().square()


@register_kl("k3")
def k3(inp: KLInput) -> torch.Tensor:
    """``exp(x) - x - 1`` with ``x = ref_logp - logp`` clamped to [-20, 20], shape ``(B, T)``.

    The low-variance estimator (verl's ``low_var_kl``, TRL's beta term): unbiased, >= 0, but
    its gradient estimates the forward KL's. The clamp is verl's guard against overflow;
    departure: verl also clamps the output to [-10, 10], which would zero the gradient of
    tokens whose estimate exceeds 10, and that is not done here.
    """
    x_B_T = (-inp.log_ratio()).clamp(-20.0, 20.0)
    return torch.expm1(x_B_T) - x_B_T


@register_kl("k3_st")
@register_kl("k3+")
def k3_straight_through(inp: KLInput) -> torch.Tensor:
    """k3 in value, k2 in gradient: ``k2 + sg(k3 - k2)``, shape ``(B, T)``.

    The value is the unbiased, non-negative k3 (what gets logged); the gradient
    ``(logp - ref) grad logp`` is the unbiased gradient of KL(pi_theta || pi_ref) (verl's
    "k3+").
    """
    kl2_B_T = k2(inp)
    return kl2_B_T + (k3(inp) - kl2_B_T).detach()
