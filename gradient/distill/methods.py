"""Distillation methods the trainer runs, as registered specs over one typed input.

A method is an advantage transform at the rollout's birth (``DistillInput`` ->
``DistillOutput``: per-token advantages for the ordinary policy loss and which rollouts
stay) plus a declaration of what the trainer must compute for it: which
models it loads, how the teacher scores a rollout, whether it needs the student's entropy,
hidden states or the teacher's solve rates, and whether a full-distribution divergence joins
the loss. The trainer reads the declaration; it never branches on a method's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gradient.distill.dear import anchor_similarity, dear_weights, decision_mask, evidence_mask
from gradient.distill.opd import combine_with_reward, reverse_kl_advantage
from gradient.distill.ra_opd import ra_keep, ra_metrics
from gradient.distill.rstg import (hybrid_advantage, linear_anneal, sft_rows, soft_or_scores,
                                   solve_rate_inputs, top_fraction)
from gradient.distill.scoring import (self_view_divergence, teacher_divergence, teacher_scorer,
                                      views_scorer, w2s_divergence, w2s_scorer)
from populations.registry import Registry


@dataclass(frozen=True)
class DistillInput:
    """B fresh rollouts by T generated tokens."""

    # The sampler's log-probs of the sampled tokens (the student that produced them).
    student_logp_B_T: torch.Tensor
    # The teacher's log-probs of the same tokens given the same prefixes (for avsd the
    # multi-view target's, for w2s the proxy's).
    teacher_logp_B_T: torch.Tensor
    # 1 on generated tokens, 0 on padding.
    mask_B_T: torch.Tensor
    # The task reward's advantage per rollout (the configured estimator's) and the raw reward.
    reward_adv_B: torch.Tensor
    reward_B: torch.Tensor
    # algo.distill (DistillSettings): coefficients and the method's own knobs.
    settings: object
    step: int = 0
    # Filled when the method's spec asks for them: the student's entropy and hidden states at
    # each position, whether the rollout's group failed entirely, the teacher's solve rate on
    # the rollout's prompt.
    entropy_B_T: torch.Tensor | None = None
    hidden_B_T_H: torch.Tensor | None = None
    failed_B: torch.Tensor | None = None
    omega_B: torch.Tensor | None = None
    # Whether the verifier judged each rollout correct.
    correct_B: torch.Tensor | None = None


@dataclass(frozen=True)
class DistillOutput:
    # Per-token advantages (0 on padding) and which rollouts stay in the batch.
    adv_B_T: torch.Tensor
    keep_B: torch.Tensor
    metrics: dict


@dataclass(frozen=True)
class MethodSpec:
    advantages: Callable[[DistillInput], DistillOutput]
    # Frozen models it loads besides the student: teacher, base (the initial student),
    # positive, negative.
    models: tuple[str, ...] = ("teacher",)
    # How teacher_logp_B_T is made (a scorer of ``scoring``): the teacher model on the same
    # prompt, the AVSD target over privileged views, the W2S proxy teacher; None: not needed
    # (the method's whole signal is its divergence term).
    scorer: Callable | None = teacher_scorer
    # It reads the student's entropy at each generated position.
    needs_entropy: bool = False
    # The layer whose hidden states it reads there, from the settings (DEAR's ``dear.layer``);
    # None: it reads none.
    hidden_layer: Callable[[object], int] | None = None
    # What else it reads at birth, as ``DistillInput`` fields: ``(edges, fresh rollouts, cfg,
    # step, memo, device) -> dict``, memo being what the run keeps for the method from step to
    # step (RSTG's teacher solve rates); None: nothing.
    birth_inputs: Callable | None = None
    # Rows it adds to the step after the kept rollouts: ``(fresh rollouts, those fields, cfg,
    # step, memo) -> (rollouts, metrics)`` (RSTG's SFT rows); None: none.
    extra_rows: Callable | None = None
    # A full-distribution divergence added to the loss (a divergence of ``scoring``): to the
    # teacher, to the W2S proxy, or dOPSD's self view (the same model on a later state of the
    # trajectory, which needs the sampler to record its states); None: no such term.
    divergence: Callable | None = None
    # What in the settings makes the method read each problem's reference solution (for the
    # error when a problem has none), or None when they do not.
    needs_references: Callable[[object], str | None] = lambda settings: None


_METHODS: Registry[MethodSpec] = Registry("distillation method")


def distill_method_names() -> list[str]:
    return _METHODS.names()


def method_spec(name: str) -> MethodSpec:
    """The spec of method ``name``; ValueError naming the valid methods if unknown."""
    return _METHODS.get(name)


def run_distill(name: str, inp: DistillInput) -> DistillOutput:
    return _METHODS.get(name).advantages(inp)


def _register(name: str, **declaration):
    def decorator(fn):
        _METHODS.register(name)(MethodSpec(fn, **declaration))
        return fn
    return decorator


def _keep_all(adv_B_T: torch.Tensor) -> torch.Tensor:
    return torch.ones(adv_B_T.shape[0], dtype=torch.bool, device=adv_B_T.device)


def _advantages(inp: DistillInput) -> tuple[torch.Tensor, torch.Tensor]:
    s = inp.settings
    adv_kl_B_T = reverse_kl_advantage(inp.student_logp_B_T, inp.teacher_logp_B_T, inp.mask_B_T)
    adv_B_T = combine_with_reward(adv_kl_B_T, s.reward_coef * inp.reward_adv_B, inp.mask_B_T,
                                  s.kl_coef)
    return adv_kl_B_T, adv_B_T


@_register("opd")
def opd(inp: DistillInput) -> DistillOutput:
    """On-policy distillation (Thinking Machines / Tinker): every rollout, advantage
    ``reward_coef * A_reward + kl_coef * -(log pi_S - log pi_T)`` per token."""
    _, adv_B_T = _advantages(inp)
    return DistillOutput(adv_B_T, _keep_all(adv_B_T), {})


@_register("ra_opd")
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


@_register("rstg", needs_entropy=True, birth_inputs=solve_rate_inputs, extra_rows=sft_rows)
def rstg(inp: DistillInput) -> DistillOutput:
    """RSTG (Han et al. 2026, arXiv 2608.00782; see ``rstg``): the configured GRPO advantage
    on every group with a success; in groups where every rollout failed, ``beta * omega *
    (log pi_T - log pi_S)`` on the top ``token_frac`` tokens by the soft-OR of student entropy
    and divergence, beta annealed per step, omega the teacher's solve rate on the prompt. The
    SFT term on the teacher's correct trajectory joins the step as extra rows
    (``rstg.sft_rows``)."""
    r = inp.settings.rstg
    adv_kl_B_T = reverse_kl_advantage(inp.student_logp_B_T, inp.teacher_logp_B_T, inp.mask_B_T)
    score_B_T = soft_or_scores(inp.entropy_B_T, adv_kl_B_T, inp.mask_B_T)
    select_B_T = top_fraction(score_B_T, inp.mask_B_T, r.token_frac)
    beta = linear_anneal(inp.step, r.beta_init, r.beta_decay, r.beta_floor)
    adv_B_T = hybrid_advantage(inp.reward_adv_B, adv_kl_B_T, inp.failed_B, inp.omega_B, beta,
                               select_B_T, inp.mask_B_T)
    failed = inp.failed_B.float()
    return DistillOutput(adv_B_T, _keep_all(adv_B_T), {
        "beta": beta, "failed_frac": float(failed.mean()),
        "omega_mean": float((inp.omega_B * failed).sum() / failed.sum().clamp(min=1)),
        "selected_frac": float(select_B_T.sum() / inp.mask_B_T.sum().clamp(min=1))})


@_register("dear", needs_entropy=True, hidden_layer=lambda settings: settings.dear.layer)
def dear(inp: DistillInput) -> DistillOutput:
    """DEAR (Xiao et al. 2026, arXiv 2606.22830; the project's reading in ``dear``): OPD
    whose token losses are weighted towards decisions (high student entropy) and their
    evidence (hidden states similar to a decision's, boosted by divergence), weights
    normalised to mean 1 over the batch's tokens."""
    d = inp.settings.dear
    adv_kl_B_T, adv_B_T = _advantages(inp)
    decision_B_T = decision_mask(inp.entropy_B_T, inp.mask_B_T, d.q)
    sim_B_T = anchor_similarity(inp.hidden_B_T_H, decision_B_T, inp.mask_B_T, window=d.window)
    evidence_B_T = evidence_mask(sim_B_T, adv_kl_B_T, decision_B_T, inp.mask_B_T, d.r, d.boost)
    weight_B_T = dear_weights(decision_B_T, evidence_B_T, inp.mask_B_T, d.w_decision,
                              d.w_evidence, d.w_other).to(adv_B_T.dtype)
    tokens = inp.mask_B_T.sum().clamp(min=1)
    return DistillOutput(adv_B_T * weight_B_T, _keep_all(adv_B_T), {
        "decision_frac": float(decision_B_T.sum() / tokens),
        "evidence_frac": float(evidence_B_T.sum() / tokens)})


@_register("avsd", models=("base",), scorer=views_scorer,
           needs_references=lambda s: ("algo.distill.avsd's full and partial views"
                                       if set(s.avsd.views) & {"full", "partial"} else None))
def avsd(inp: DistillInput) -> DistillOutput:
    """AVSD (Nguyen et al. 2026, arXiv 2605.20643; see ``avsd``), sampled-token form: the
    teacher log-prob is the bounded consensus target ``log q*`` over the privileged views at
    the sampled token, and the advantage is ``log q* - log pi_S`` (the paper's Tinker-form
    variant; its full-support reverse KL over the candidates is not implemented)."""
    _, adv_B_T = _advantages(inp)
    return DistillOutput(adv_B_T, _keep_all(adv_B_T), {})


def _reward_only(inp: DistillInput) -> DistillOutput:
    """The task-reward part of the advantage only (its weight ``reward_coef``, 0 = none):
    the distillation signal of these methods is the divergence term of the loss."""
    s, mask_B_T = inp.settings, inp.mask_B_T
    adv_B_T = (s.reward_coef * inp.reward_adv_B.to(mask_B_T.dtype))[:, None] * mask_B_T
    return DistillOutput(adv_B_T, _keep_all(adv_B_T), {})


# GKD's generalized JSD to the teacher over the full vocabulary or its top-K (``opd``).
_register("gjsd", divergence=teacher_divergence)(_reward_only)
# W2S-OPD: reverse KL to the proxy teacher base + alpha (positive - negative) (``w2s``).
_register("w2s", models=("base", "positive", "negative"), scorer=w2s_scorer,
          divergence=w2s_divergence)(_reward_only)


@_register("dopsd", models=("base",), scorer=None, divergence=self_view_divergence)
def dopsd(inp: DistillInput) -> DistillOutput:
    """dOPSD (Dat, Li, Wang 2026, arXiv 2607.04428) for masked-diffusion students: no
    advantage term; the loss is the generalized JSD between the student on an intermediate
    state of its own trajectory and the teacher on a later state (``dllm.estimators``). With
    ``filter_wrong`` the rollouts the verifier rejects leave the batch (loss 0 on them)."""
    adv_B_T = torch.zeros_like(inp.mask_B_T)
    keep_B = (inp.correct_B.bool() if inp.settings.dopsd.filter_wrong
              else _keep_all(adv_B_T))
    return DistillOutput(adv_B_T, keep_B, {"kept_frac": float(keep_B.float().mean())})
