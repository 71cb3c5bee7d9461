"""Policy losses of the GRPO family: per-token clipped surrogates and their diagnostics.

Every loss is registered with ``@register_loss(name)``, takes the same ``LossInput`` and
returns ``(loss_B_T, metrics)``; ``compute_loss(name, inp)`` dispatches. The loss is to be
minimised (it is minus the surrogate objective). Reduction over tokens and rows is separate
(``gradient.maths.aggregation.aggregate``), so a loss never knows the batch geometry, the world
size or the number of accumulation steps, and never leaves the device (no ``.item()``).

Masking: ``loss_B_T`` is exactly 0 wherever ``mask_B_T`` is 0, and the values sitting there
(padding, prompt tokens, anything finite) change neither the loss nor its gradient: every
masked entry is replaced by a neutral value with ``torch.where`` before any arithmetic.

Metrics are detached 0-d tensors, means over this call's masked tokens (the trainer averages
them over micro-batches and ranks):

- ``clipfrac``: fraction of tokens whose gradient the clip removed (ratio above the upper
  bound with A > 0, or below the lower bound with A < 0), as TRL and verl report it;
  ``clipfrac_low`` and ``clipfrac_high`` split it by side;
- ``dualclipfrac``: fraction of tokens capped by the dual clip (0 when it is off);
- ``ratio_mean``: mean importance ratio (for the sequence losses, the sequence ratio each
  token sees);
- ``approx_kl``: mean k3 estimate of KL(old || current) from the token log-ratios
  ``x = logp - old_logp`` (clamped to [-20, 20]): ``exp(x) - 1 - x`` (Schulman's "approx
  KL"), always token-level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from populations.numbers import is_finite_number
from populations.registry import Registry

LossFn = Callable[["LossInput"], tuple[torch.Tensor, dict[str, torch.Tensor]]]
_LOSSES: Registry[LossFn] = Registry("policy loss")
_ROW_CLIP: set[str] = set()


@dataclass(frozen=True)
class LossInput:
    """The one input every policy loss takes; B rollouts (rows) by T token positions.

    Advantages are per token (``adv_B_T``), the general form: outcome-level estimators give
    one value per rollout, broadcast with ``token_advantages``; on-policy distillation puts a
    different advantage on every token. ``old_logp_B_T``, ``adv_B_T``, ``clip_high_B`` and
    ``is_weight_B_T`` are detached inside the losses, so passing tensors that carry a graph
    does not leak gradient into them.

    Raises ValueError on wrong shapes or clip settings. Tensor *values* are not checked (that
    would cost a host sync per micro-batch); ``gapo_clip_high`` builds valid per-row bounds.
    """

    # Log-probs of the sampled tokens under the policy being trained (requires grad).
    logp_B_T: torch.Tensor
    # Log-probs of the same tokens under the behaviour policy that produced them (frozen).
    old_logp_B_T: torch.Tensor
    # Advantage of each token; an outcome advantage is the same value along a row.
    adv_B_T: torch.Tensor
    # Nonzero (1 or True) where the token is in the loss: generated tokens only, never prompt,
    # given prefix or padding.
    mask_B_T: torch.Tensor
    # Lower clip width in [0, 1]: below 1 - clip_low a ratio stops pulling when A < 0.
    clip_low: float
    # Upper clip width >= 0: above 1 + clip_high a ratio stops pushing when A > 0. DAPO's
    # clip-higher sets it above clip_low (0.2 / 0.28); sequence ratios need ~100x smaller
    # widths (GSPO 3e-4 / 4e-4, GAPO 3e-3 / 5e-3).
    clip_high: float
    # Dual clip c > 1 (verl's clip_ratio_c, e.g. 3): when A < 0 the loss is capped at c * |A|,
    # so a token whose ratio exploded cannot dominate the step. None = off.
    dual_clip: float | None = None
    # Per-row upper clip widths (GAPO); where given they replace ``clip_high`` for any loss.
    clip_high_B: torch.Tensor | None = None
    # Importance weight multiplying each token's loss, e.g. the trainer/engine mismatch
    # correction (TIS/MIS). None = 1.
    is_weight_B_T: torch.Tensor | None = None

    def __post_init__(self):
        lp = self.logp_B_T
        if not isinstance(lp, torch.Tensor) or lp.dim() != 2 or not lp.dtype.is_floating_point:
            raise ValueError(f"logp_B_T must be a 2-D floating tensor (rows x tokens), got "
                             f"{type(lp).__name__} of shape {getattr(lp, 'shape', None)}")
        for name in ("old_logp_B_T", "adv_B_T", "mask_B_T", "is_weight_B_T"):
            t = getattr(self, name)
            if name == "is_weight_B_T" and t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.shape != lp.shape:
                raise ValueError(f"{name} must be a tensor of logp_B_T's shape "
                                 f"{tuple(lp.shape)}, got {getattr(t, 'shape', type(t))}")
        if self.clip_high_B is not None and (not isinstance(self.clip_high_B, torch.Tensor)
                                             or self.clip_high_B.shape != lp.shape[:1]):
            raise ValueError(f"clip_high_B must be a tensor of shape ({lp.shape[0]},), one "
                             f"upper clip width per row, got "
                             f"{getattr(self.clip_high_B, 'shape', type(self.clip_high_B))}")
        if not (is_finite_number(self.clip_low) and 0 <= self.clip_low <= 1):
            raise ValueError(f"clip_low must be a number in [0, 1] (the lower ratio bound is "
                             f"1 - clip_low), got {self.clip_low!r}")
        if not (is_finite_number(self.clip_high) and self.clip_high >= 0):
            raise ValueError(f"clip_high must be a finite number >= 0 (the upper ratio bound is "
                             f"1 + clip_high), got {self.clip_high!r}")
        if not 1 - self.clip_low < 1 + self.clip_high:
            raise ValueError(f"the clip range [1 - clip_low, 1 + clip_high] = "
                             f"[{1 - self.clip_low}, {1 + self.clip_high}] is empty; make "
                             f"clip_low or clip_high positive")
        if self.dual_clip is not None and not (is_finite_number(self.dual_clip) and self.dual_clip > 1):
            raise ValueError(f"dual_clip must be a number > 1 (the cap on the loss is "
                             f"dual_clip * |A| when A < 0) or None, got {self.dual_clip!r}")


def register_loss(name: str, row_clip: bool = False):
    """Decorator registering ``fn(inp: LossInput) -> (loss_B_T, metrics)`` under ``name``;
    ``row_clip``: the loss reads per-row upper clip widths ``clip_high_B`` (the trainer's
    ``row_clip_bounds`` birth stage makes them)."""
    def decorator(fn: LossFn) -> LossFn:
        _LOSSES.register(name)(fn)
        if row_clip:
            _ROW_CLIP.add(name)
        return fn
    return decorator


def needs_row_clip(name: str) -> bool:
    """Whether policy loss ``name`` (a registered one) needs per-row clip widths."""
    _LOSSES.get(name)
    return name in _ROW_CLIP


def loss_names() -> list[str]:
    """The registered policy loss names, sorted."""
    return _LOSSES.names()


def compute_loss(name: str, inp: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss_B_T, metrics)`` of policy loss ``name`` on ``inp``.

    Raises ValueError naming the valid losses if ``name`` is not registered.
    """
    return _LOSSES.get(name)(inp)


def token_advantages(adv_B: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Broadcast one advantage per rollout over its tokens: ``adv_B_T``, mask's shape.

    A float view of ``adv_B`` (no copy); values at masked positions are irrelevant to the
    losses.
    """
    if adv_B.dim() != 1 or adv_B.shape[0] != mask_B_T.shape[0]:
        raise ValueError(f"adv_B must have shape ({mask_B_T.shape[0]},), got {tuple(adv_B.shape)}")
    adv_B = adv_B if adv_B.dtype.is_floating_point else adv_B.to(torch.get_default_dtype())
    return adv_B[:, None].expand(-1, mask_B_T.shape[1])


def _masked_mean(x_B_T: torch.Tensor, keep_B_T: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over kept positions; 0 when nothing is kept."""
    n = keep_B_T.sum().clamp(min=1)
    return torch.where(keep_B_T, x_B_T, torch.zeros_like(x_B_T)).sum() / n


def _clipped_surrogate(inp: LossInput, ratio_B_T: torch.Tensor, tok_log_ratio_B_T: torch.Tensor,
                       keep_B_T: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO clipped loss on ``ratio_B_T`` (token or sequence level), with the optional
    per-row upper bound, dual clip and importance weight; masked entries are exactly 0."""
    like = dict(dtype=ratio_B_T.dtype, device=ratio_B_T.device)
    zero = torch.zeros((), **like)
    adv_B_T = torch.where(keep_B_T, inp.adv_B_T.detach().to(**like), zero)
    lo = torch.full((), 1.0 - inp.clip_low, **like)
    if inp.clip_high_B is None:
        hi = torch.full((), 1.0 + inp.clip_high, **like)
    else:
        hi = 1.0 + inp.clip_high_B.detach().to(**like)[:, None]
    unclipped_B_T = -adv_B_T * ratio_B_T
    clipped_B_T = -adv_B_T * ratio_B_T.clamp(min=lo, max=hi)
    # The pessimistic (larger) loss: once the ratio has moved past the bound in the direction
    # the advantage favours, the clamped branch wins and its gradient is 0.
    loss_B_T = torch.maximum(unclipped_B_T, clipped_B_T)
    dual_B_T = torch.zeros_like(keep_B_T)
    if inp.dual_clip is not None:
        cap_B_T = -adv_B_T * inp.dual_clip
        dual_B_T = (adv_B_T < 0) & (loss_B_T > cap_B_T)
        loss_B_T = torch.where(dual_B_T, cap_B_T, loss_B_T)
    if inp.is_weight_B_T is not None:
        loss_B_T = loss_B_T * torch.where(keep_B_T, inp.is_weight_B_T.detach().to(**like), zero)
    loss_B_T = torch.where(keep_B_T, loss_B_T, zero)

    with torch.no_grad():
        dtype = ratio_B_T.dtype
        r_B_T = ratio_B_T.detach()
        low_B_T = (adv_B_T < 0) & (r_B_T < lo)
        high_B_T = (adv_B_T > 0) & (r_B_T > hi)
        # Clamped like the ratios, so one wild token cannot make the mean overflow to inf.
        x_B_T = tok_log_ratio_B_T.detach().clamp(-20.0, 20.0)
        metrics = {
            "clipfrac": _masked_mean((low_B_T | high_B_T).to(dtype), keep_B_T),
            "clipfrac_low": _masked_mean(low_B_T.to(dtype), keep_B_T),
            "clipfrac_high": _masked_mean(high_B_T.to(dtype), keep_B_T),
            "dualclipfrac": _masked_mean(dual_B_T.to(dtype), keep_B_T),
            "ratio_mean": _masked_mean(r_B_T, keep_B_T),
            "approx_kl": _masked_mean(torch.expm1(x_B_T) - x_B_T, keep_B_T),
        }
    return loss_B_T, metrics


def _token_log_ratio(inp: LossInput, keep_B_T: torch.Tensor) -> torch.Tensor:
    """``logp - old_logp`` at kept tokens, exactly 0 elsewhere (so garbage cannot leak)."""
    d_B_T = inp.logp_B_T - inp.old_logp_B_T.detach().to(inp.logp_B_T.dtype)
    return torch.where(keep_B_T, d_B_T, torch.zeros_like(d_B_T))


@register_loss("ppo_clip")
def ppo_clip(inp: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level PPO clip with separate widths and optional dual clip, shape ``(B, T)``.

    ``L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` with ``r = exp(logp - old)``
    per token (Schulman et al. 2017, arXiv 1707.06347; GRPO, arXiv 2402.03300). Separate
    widths are DAPO's clip-higher (arXiv 2503.14476). With ``dual_clip`` c and A < 0,
    ``L = min(L, -c A)`` (Ye et al. 2020, arXiv 1912.09729; verl's ``vanilla``). With
    ``clip_high_B`` this is the token-IS variant of GAPO. The log-ratio is clamped to
    [-20, 20] before exp, as verl: a ratio beyond e^20 carries no gradient.
    """
    keep_B_T = inp.mask_B_T != 0
    log_ratio_B_T = _token_log_ratio(inp, keep_B_T)
    ratio_B_T = torch.exp(log_ratio_B_T.clamp(-20.0, 20.0))
    return _clipped_surrogate(inp, ratio_B_T, log_ratio_B_T, keep_B_T)


@register_loss("gspo")
def gspo(inp: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sequence-level ratio clip (GSPO, Zheng et al. 2025, arXiv 2507.18071), shape ``(B, T)``.

    The sequence ratio ``s_i = exp(mean_t (logp - old))`` over row i's masked tokens (a
    length-normalised geometric mean) is clipped as in ``ppo_clip``. It is used in the
    GSPO-token form ``s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t))``: the value at every token
    is ``s_i``, and the gradient at token t is ``s_i * grad logp_t``. With an advantage that is
    constant along the row and ``seq-mean-token-mean`` aggregation this is exactly GSPO's
    gradient ``s_i * mean_t grad logp_t`` (verl forces that mode for gspo; here the caller
    chooses it); per-token advantages give GSPO-token.

    Clamp: the detached sequence log-ratio is clamped to [-20, 10] before exp. Departure:
    verl clamps the whole ``log s_{i,t}`` at 10, which also zeroes the gradient of rows past
    e^10; here the value is bounded and the gradient weight saturates at e^10 instead (such
    rows are clipped anyway when A > 0, and capped by ``dual_clip`` when A < 0).
    A row with no masked tokens has s = 1 and loss 0.
    """
    keep_B_T = inp.mask_B_T != 0
    log_ratio_B_T = _token_log_ratio(inp, keep_B_T)
    n_B = keep_B_T.sum(dim=1).clamp(min=1)
    seq_log_ratio_B = log_ratio_B_T.sum(dim=1) / n_B
    logp_B_T = torch.where(keep_B_T, inp.logp_B_T, torch.zeros_like(inp.logp_B_T))
    # logp - sg(logp) is 0 in value and carries d/dlogp = 1: the straight-through term.
    log_s_B_T = (seq_log_ratio_B.detach().clamp(-20.0, 10.0)[:, None]
                 + logp_B_T - logp_B_T.detach())
    return _clipped_surrogate(inp, torch.exp(log_s_B_T), log_ratio_B_T, keep_B_T)


@register_loss("gapo", row_clip=True)
def gapo(inp: LossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO with a per-row upper clip width (GAPO, arXiv 2609.00444), shape ``(B, T)``.

    ``L = max(-A s_i, -A clip(s_i, 1 - clip_low, 1 + clip_high_B[i]))`` on the sequence ratio
    of ``gspo`` (same GSPO-token form and clamps). ``clip_high_B`` is required; build it with
    ``gapo_clip_high`` (flattened prompt-major to B = P * G rows). The paper pairs it with
    ``dr_grpo`` advantages and sequence clip widths such as (3e-3, 5e-3).
    """
    if inp.clip_high_B is None:
        raise ValueError("the gapo loss needs clip_high_B, the per-row upper clip widths; build "
                         "them with gapo_clip_high(correct_P_G, eps_lo, eps_hi_max)")
    return gspo(inp)


def gapo_eps_hi(c: torch.Tensor, k: int, eps_lo: float, eps_hi_max: float) -> torch.Tensor:
    """GAPO's upper clip width for a correct rollout of a group with ``c`` correct out of k.

    ``eps_hi(c) = eps_lo + (eps_hi_max - eps_lo) (k - c) / (k - 1)`` (arXiv 2609.00444,
    Eq. 11), with c clamped to [1, k]: the rarer the success, the larger its advantage
    (k - c)/k and the larger the trust region it is allowed (the optimal ratio grows like
    exp(A / lambda)). At c = 0 there is no correct rollout to apply it to. ``c`` is a count
    tensor of any shape; the result is float64 of the same shape.
    """
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 2):
        raise ValueError(f"k (rollouts per group) must be an integer >= 2, got {k!r}")
    if not (is_finite_number(eps_lo) and is_finite_number(eps_hi_max) and 0 <= eps_lo <= eps_hi_max):
        raise ValueError(f"need finite 0 <= eps_lo <= eps_hi_max, got eps_lo={eps_lo!r}, "
                         f"eps_hi_max={eps_hi_max!r}")
    c = torch.as_tensor(c).to(torch.float64).clamp(1, k)
    return eps_lo + (eps_hi_max - eps_lo) * (k - c) / (k - 1)


def gapo_clip_high(correct_P_G: torch.Tensor, eps_lo: float, eps_hi_max: float) -> torch.Tensor:
    """Per-rollout upper clip widths ``clip_high_P_G`` (float64) for the ``gapo`` loss.

    ``correct_P_G`` marks correct rollouts (bool, or 0/1 numbers) of P groups of k = G.
    A correct rollout gets ``gapo_eps_hi(c_p, G, eps_lo, eps_hi_max)`` with c_p its group's
    number of correct rollouts; an incorrect one gets ``eps_lo`` (its advantage is <= 0, so
    the upper bound never binds). Feed ``clip_high_P_G.reshape(-1)`` as ``clip_high_B`` when
    the rows are laid out prompt-major, and ``clip_low = eps_lo``.
    """
    if not isinstance(correct_P_G, torch.Tensor) or correct_P_G.dim() != 2:
        raise ValueError(f"correct_P_G must be a 2-D tensor (prompts x rollouts), got "
                         f"{getattr(correct_P_G, 'shape', type(correct_P_G))}")
    if correct_P_G.dtype != torch.bool:
        if not bool(((correct_P_G == 0) | (correct_P_G == 1)).all()):
            raise ValueError("correct_P_G must be bool or hold only 0 and 1 (binary rewards)")
        correct_P_G = correct_P_G == 1
    c_P = correct_P_G.sum(dim=1)
    eps_hi_P = gapo_eps_hi(c_P, correct_P_G.shape[1], eps_lo, eps_hi_max)
    return torch.where(correct_P_G, eps_hi_P[:, None], float(eps_lo))
