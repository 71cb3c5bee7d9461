"""Distillation methods the trainer runs, as registered functions of one typed input.

Each method turns the teacher's and the student's log-probs of the student's own sampled
tokens into per-token advantages for the ordinary policy loss, and may drop rollouts. The
trainer picks one by ``algo.distill.method``; a new method is one function here, a config
and a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gradient.distill.opd import combine_with_reward, reverse_kl_advantage
from gradient.distill.ra_opd import ra_keep, ra_metrics
from gradient.registry import Registry


@dataclass(frozen=True)
class DistillInput:
    """B fresh rollouts by T generated tokens."""

    # The sampler's log-probs of the sampled tokens (the student that produced them).
    student_logp_B_T: torch.Tensor
    # The teacher's log-probs of the same tokens given the same prefixes.
    teacher_logp_B_T: torch.Tensor
    # 1 on generated tokens, 0 on padding.
    mask_B_T: torch.Tensor
    # The task reward's advantage per rollout (the configured estimator's) and the raw reward.
    reward_adv_B: torch.Tensor
    reward_B: torch.Tensor
    kl_coef: float
    reward_coef: float


@dataclass(frozen=True)
class DistillOutput:
    # Per-token advantages (0 on padding) and which rollouts stay in the batch.
    adv_B_T: torch.Tensor
    keep_B: torch.Tensor
    metrics: dict


_METHODS: Registry[Callable[[DistillInput], DistillOutput]] = Registry("distillation method")


def distill_method_names() -> list[str]:
    return _METHODS.names()


def run_distill(name: str, inp: DistillInput) -> DistillOutput:
    """Method ``name`` on ``inp``; ValueError naming the valid methods if unknown."""
    return _METHODS.get(name)(inp)


def _advantages(inp: DistillInput) -> tuple[torch.Tensor, torch.Tensor]:
    adv_kl_B_T = reverse_kl_advantage(inp.student_logp_B_T, inp.teacher_logp_B_T, inp.mask_B_T)
    adv_B_T = combine_with_reward(adv_kl_B_T, inp.reward_coef * inp.reward_adv_B, inp.mask_B_T,
                                  inp.kl_coef)
    return adv_kl_B_T, adv_B_T


@_METHODS.register("opd")
def opd(inp: DistillInput) -> DistillOutput:
    """On-policy distillation (Thinking Machines / Tinker): every rollout, advantage
    ``reward_coef * A_reward + kl_coef * -(log pi_S - log pi_T)`` per token."""
    _, adv_B_T = _advantages(inp)
    keep_B = torch.ones(adv_B_T.shape[0], dtype=torch.bool, device=adv_B_T.device)
    return DistillOutput(adv_B_T, keep_B, {})


@_METHODS.register("ra_opd")
def ra_opd(inp: DistillInput) -> DistillOutput:
    """RA-OPD (Gan et al. 2026, arXiv 2608.27960; see ``ra_opd``): OPD on the rollouts whose
    length-normalised distillation return agrees in sign with the outcome ``2 R - 1``
    (binary rewards: a solved rollout needs a teacher that liked it, a failed one a teacher
    that did not); the others leave the batch, so the token-mean aggregation normalises by
    kept tokens. Logs the kept fractions."""
    adv_kl_B_T, adv_B_T = _advantages(inp)
    outcome_B = (2 * inp.reward_B - 1).to(adv_kl_B_T.dtype)
    keep_B = ra_keep(adv_kl_B_T, inp.mask_B_T, outcome_B)
    return DistillOutput(adv_B_T, keep_B, {k: float(v) for k, v in
                                           ra_metrics(keep_B, inp.mask_B_T).items()})
