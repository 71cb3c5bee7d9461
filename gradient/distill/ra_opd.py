"""RA-OPD: keep a trajectory for distillation only when the teacher agrees with the outcome.

Gan et al. 2026, Reward-Aligned On-Policy Distillation (arXiv 2608.27960). With the per-token
OPD advantage ``a_t = log pi_T(o_t) - log pi_S(o_t)`` (``opd.reverse_kl_advantage``), the
distillation return of a trajectory is its length-normalised sum

    G(tau) = (1 / |tau|) sum_t a_t,

and the trajectory is kept iff ``(2R - 1) * G >= 0``: a correct one (R = 1) iff the teacher
rates it at least as likely as the student does, an incorrect one (R = 0) iff the teacher
rates it at most as likely. Reverse-KL OPD then runs on kept trajectories only, normalised
by Z = the number of kept tokens: the dropped ones leave the batch, so the trainer's
token-mean aggregation divides by the kept tokens of the step.
"""

from __future__ import annotations

import torch

from gradient.distill.opd import check_b_t


def distillation_return(adv_kl_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """``G_B``: the mean of ``adv_kl_B_T`` over each row's masked tokens (0 for an empty row),
    detached, in ``adv_kl_B_T``'s dtype. Arxiv 2608.27960's G(tau)."""
    keep_B_T = check_b_t(mask_B_T, adv_kl_B_T=adv_kl_B_T)
    a = adv_kl_B_T.detach()
    total_B = torch.where(keep_B_T, a, torch.zeros((), dtype=a.dtype, device=a.device)).sum(1)
    return total_B / keep_B_T.sum(1).clamp(min=1).to(a.dtype)


def ra_keep(adv_kl_B_T: torch.Tensor, mask_B_T: torch.Tensor,
            reward_adv_B: torch.Tensor) -> torch.Tensor:
    """Reward-aligned keep mask ``keep_B`` (bool): ``sign(reward_adv_b) * G_b >= 0``.

    arXiv 2608.27960, ``m(tau) = 1[(2R - 1) G >= 0]``. ``adv_kl_B_T`` is the OPD advantage
    ``log pi_T - log pi_S`` of the sampled tokens; ``reward_adv_B`` is a signed outcome, one
    per row. Passing ``2R - 1`` for a binary reward R reproduces the paper exactly.

    The four sign cases: outcome > 0 keeps G > 0 and drops G < 0; outcome < 0 keeps G < 0 and
    drops G > 0. Zero cases, following the paper's ``>=``: G = 0 is kept whatever the
    outcome, and an outcome of exactly 0 keeps the row whatever G.

    Project's reading (the paper uses the raw binary reward): a group-centred advantage may be
    passed instead of ``2R - 1``; then a correct rollout in a mixed group is positive and an
    incorrect one negative, as in the paper, but a row of an all-equal group has advantage 0
    and is always kept. Pass ``2R - 1`` if all-correct groups should still be filtered.
    Departure: rows with no masked tokens are never kept (they carry no tokens, and this keeps
    the kept fraction about real trajectories).
    """
    g_B = distillation_return(adv_kl_B_T, mask_B_T)
    if not (isinstance(reward_adv_B, torch.Tensor) and reward_adv_B.shape == g_B.shape):
        raise ValueError(f"reward_adv_B must have shape ({g_B.shape[0]},), got "
                         f"{tuple(getattr(reward_adv_B, 'shape', ()))}")
    aligned_B = torch.sign(reward_adv_B.detach()).to(g_B.dtype) * g_B >= 0
    return aligned_B & mask_B_T.bool().any(1)


def kept_token_mask(keep_B: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """``mask_B_T`` restricted to kept rows (bool, ``(B, T)``): the loss mask of RA-OPD."""
    keep_B_T = check_b_t(mask_B_T)
    if not (isinstance(keep_B, torch.Tensor) and keep_B.shape == keep_B_T.shape[:1]):
        raise ValueError(f"keep_B must have shape ({keep_B_T.shape[0]},)")
    return keep_B_T & keep_B.bool()[:, None]


def ra_metrics(keep_B: torch.Tensor, mask_B_T: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached 0-d metrics: ``kept_frac`` (kept rows over rows with tokens) and
    ``kept_token_frac`` (kept tokens over masked tokens); 0 when there are none."""
    m_B_T = check_b_t(mask_B_T)
    kept_B_T = kept_token_mask(keep_B, mask_B_T)
    dt = torch.get_default_dtype()
    rows = m_B_T.any(1)
    return {
        "kept_frac": (keep_B.bool() & rows).sum().to(dt) / rows.sum().clamp(min=1).to(dt),
        "kept_token_frac": kept_B_T.sum().to(dt) / m_B_T.sum().clamp(min=1).to(dt),
    }
