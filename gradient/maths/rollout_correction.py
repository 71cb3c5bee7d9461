"""Importance weights for the mismatch between the trainer and the rollout engine.

The engine (vLLM) samples with its own kernels, so its log-probability of a sampled token
differs slightly from the trainer's for the same weights, and a lot when the engine lags
behind. TRL multiplies the per-token loss by an importance weight built from

    delta_{i,t} = (log pi_old^trainer - log pi^engine)_{i,t} * m_{i,t}

(TRL ``vllm_importance_sampling_mode``; see the gradient reference, A1.3):

* token modes: ``rho_{i,t} = exp(delta_{i,t})``;
* sequence modes: ``rho_i = exp(sum_t delta_{i,t})``, a sum over the sequence's tokens, not
  a length-normalised mean, shared by all its tokens;
* ``*_truncate`` (TIS): ``rho <- clamp(rho, c_min, c_max)``;
* ``*_mask`` (MIS): ``rho <- 0`` wherever ``rho`` lies outside ``[c_min, c_max]``.

``none`` gives weight 1. Modes are registered functions of one ``Mismatch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from populations.registry import Registry


@dataclass(frozen=True)
class Mismatch:
    """The shared input of every mode: ``delta_B_T`` (0 on padding) and ``mask_B_T``
    (bool, True on real completion tokens), both detached; the bounds ``c_min <= c_max``."""

    delta_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    c_min: float
    c_max: float


def _token_ratio(x: Mismatch) -> torch.Tensor:
    return torch.exp(x.delta_B_T)


def _sequence_ratio(x: Mismatch) -> torch.Tensor:
    # exp may overflow to inf for a long, badly mismatched sequence; clamp and the mask
    # test both handle inf, so no NaN can appear.
    return torch.exp(x.delta_B_T.sum(-1, keepdim=True)).expand_as(x.delta_B_T)


def _truncate(ratio: Callable[[Mismatch], torch.Tensor], x: Mismatch):
    rho_B_T = ratio(x)
    return rho_B_T.clamp(x.c_min, x.c_max), (rho_B_T < x.c_min) | (rho_B_T > x.c_max)


def _mask(ratio: Callable[[Mismatch], torch.Tensor], x: Mismatch):
    rho_B_T = ratio(x)
    hit_B_T = (rho_B_T < x.c_min) | (rho_B_T > x.c_max)
    return torch.where(hit_B_T, torch.zeros_like(rho_B_T), rho_B_T), hit_B_T


def _none(x: Mismatch):
    return torch.ones_like(x.delta_B_T), torch.zeros_like(x.mask_B_T)


# Each mode maps a Mismatch to (weight_B_T before masking, hit_B_T: where it was truncated
# or masked).
IS_MODES: Registry[Callable[[Mismatch], tuple[torch.Tensor, torch.Tensor]]] = Registry(
    "importance-sampling mode")
IS_MODES.register("none")(_none)
IS_MODES.register("token_truncate")(partial(_truncate, _token_ratio))
IS_MODES.register("token_mask")(partial(_mask, _token_ratio))
IS_MODES.register("sequence_truncate")(partial(_truncate, _sequence_ratio))
IS_MODES.register("sequence_mask")(partial(_mask, _sequence_ratio))


def corrects(mode: str) -> bool:
    """Whether ``mode`` (a key of ``IS_MODES``) reweights anything."""
    return IS_MODES.get(mode) is not _none


def is_weights(trainer_logp_B_T: torch.Tensor, engine_logp_B_T: torch.Tensor,
               mask_B_T: torch.Tensor, *, mode: str, c_min: float, c_max: float
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance weights ``weight_B_T`` that multiply the per-token loss, and metrics.

    ``trainer_logp_B_T``: the trainer's log-probs of the sampled tokens before the update
    (``pi_old``), ``engine_logp_B_T``: the engine's (processed logprobs, same temperature),
    ``mask_B_T``: 1 on real completion tokens. Values at padding never matter (they may be
    anything, even inf or NaN). ``mode`` is a key of ``IS_MODES``; ``0 <= c_min <= c_max``.

    ``weight_B_T`` is detached and 0 on padding. Metrics are 0-d tensors (no host sync):
    ``logp_abs_diff_mean`` / ``logp_abs_diff_max`` of ``|delta|`` over real tokens,
    ``token_fraction_corrected`` (real tokens whose weight was truncated or masked) and
    ``sequence_fraction_corrected`` (sequences with at least one such token, among
    sequences with at least one real token).
    """
    if mode not in IS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; valid modes are: "
                         f"{', '.join(IS_MODES)}")
    if not 0 <= c_min <= c_max:
        raise ValueError(f"need 0 <= c_min <= c_max, got c_min={c_min}, c_max={c_max}")
    real_B_T = mask_B_T.detach().bool()
    diff_B_T = trainer_logp_B_T.detach().float() - engine_logp_B_T.detach().float()
    # where, not a product: padding may hold -inf or NaN, and 0 * inf is NaN.
    delta_B_T = torch.where(real_B_T, diff_B_T, torch.zeros_like(diff_B_T))
    rho_B_T, hit_B_T = IS_MODES.get(mode)(Mismatch(delta_B_T, real_B_T, c_min, c_max))
    weight_B_T = rho_B_T * real_B_T
    hit_B_T = hit_B_T & real_B_T
    tokens = real_B_T.sum().clamp(min=1)
    rows = real_B_T.any(-1).sum().clamp(min=1)
    metrics = {
        "logp_abs_diff_mean": delta_B_T.abs().sum() / tokens,
        "logp_abs_diff_max": delta_B_T.abs().max() if delta_B_T.numel() else delta_B_T.sum(),
        "token_fraction_corrected": hit_B_T.sum() / tokens,
        "sequence_fraction_corrected": hit_B_T.any(-1).sum() / rows,
    }
    return weight_B_T, metrics
