"""DEAR: weight OPD towards decision tokens and the evidence that leads to them.

Xiao et al. 2026, "Finding the Evidence" (arXiv 2606.22830). The abstract names decisions
(high student entropy) and evidence (intermediate steps where the student is confident yet
wrong, found by hidden-state cosine similarity to the decision anchors and boosted by the
teacher-student divergence). The procedure below is the project's reading of that abstract,
following the reference's "faithful implementation" sketch; the paper's exact equations are
not available:

1. decisions: the top-q% masked tokens of each row by student entropy;
2. anchor similarity ``e_t = max(0, max_{a in D, a != t} cos(h_t, h_a))`` on a student layer;
3. evidence score ``v_t = e_t (1 + boost * d_t)``, ``d_t = |A^OPD_t|`` normalised by its row
   maximum; evidence = the top-r% of the row's non-decision tokens by ``v``;
4. weights: ``w_decision`` on decisions, ``w_evidence`` on evidence, ``w_other`` elsewhere;
   the loss is ``sum_t w_t l_t / sum_t w_t``.

Suffix ``_H``: the hidden size of the chosen layer.
"""

from __future__ import annotations

import torch

from gradient.distill.opd import check_b_t, check_number, row_max_normalised
from gradient.distill.rstg import top_fraction


def decision_mask(entropy_B_T: torch.Tensor, mask_B_T: torch.Tensor, q: float) -> torch.Tensor:
    """Decisions (bool ``(B, T)``): the ``ceil(q * n_b)`` highest-entropy masked tokens of each
    row (``rstg.top_fraction``; ties towards earlier positions). ``entropy_B_T`` is the
    student's full-vocabulary entropy at each position."""
    return top_fraction(entropy_B_T, mask_B_T, q)


def anchor_similarity(hidden_B_T_H: torch.Tensor, decision_B_T: torch.Tensor,
                      mask_B_T: torch.Tensor, *, window: int | None = None) -> torch.Tensor:
    """``e_B_T``: each masked token's largest cosine similarity to a decision anchor of its own
    row other than itself, clamped at 0; detached; 0 where masked or with no anchor in reach.

    ``hidden_B_T_H``: student hidden states of one layer at the rollout positions.
    ``window``: if given, only anchors at most ``window`` positions away count (the sketch's
    optional restriction around each anchor). Costs O(B T^2 H) memory-light matmuls.
    Project's reading: the clamp at 0 treats "opposite to every anchor" like "no anchor".
    """
    keep_B_T = check_b_t(mask_B_T)
    if not (isinstance(hidden_B_T_H, torch.Tensor) and hidden_B_T_H.dtype.is_floating_point
            and hidden_B_T_H.dim() == 3 and hidden_B_T_H.shape[:2] == keep_B_T.shape):
        raise ValueError(f"hidden_B_T_H must be a floating (B, T, H) tensor with (B, T) = "
                         f"{tuple(keep_B_T.shape)}")
    if not (isinstance(decision_B_T, torch.Tensor) and decision_B_T.shape == keep_B_T.shape):
        raise ValueError(f"decision_B_T must have shape {tuple(keep_B_T.shape)}")
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool)
                                   and window >= 1):
        raise ValueError(f"window must be None or an integer >= 1, got {window!r}")
    dtype = torch.promote_types(hidden_B_T_H.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=hidden_B_T_H.device)
    h = torch.where(keep_B_T[..., None], hidden_B_T_H.detach().to(dtype), zero)
    unit = h / h.norm(dim=-1, keepdim=True).clamp(min=torch.finfo(dtype).tiny)
    cos_B_T_T = unit @ unit.transpose(1, 2)
    T = keep_B_T.shape[1]
    pos = torch.arange(T, device=keep_B_T.device)
    allowed_T_T = pos[:, None] != pos[None, :]
    if window is not None:
        allowed_T_T = allowed_T_T & ((pos[:, None] - pos[None, :]).abs() <= window)
    anchors_B_1_T = (decision_B_T.bool() & keep_B_T)[:, None, :]
    ok_B_T_T = anchors_B_1_T & allowed_T_T[None] & keep_B_T[..., None]
    e_B_T = torch.where(ok_B_T_T, cos_B_T_T, zero).amax(dim=-1).clamp(min=0)
    return torch.where(keep_B_T, e_B_T, zero)


def evidence_mask(similarity_B_T: torch.Tensor, adv_opd_B_T: torch.Tensor,
                  decision_B_T: torch.Tensor, mask_B_T: torch.Tensor, r: float,
                  boost: float) -> torch.Tensor:
    """Evidence (bool ``(B, T)``): the top-r% non-decision masked tokens of each row by
    ``v = e (1 + boost * d)``, ``d = |adv_opd| / max_row |adv_opd|``. ``similarity_B_T`` is
    ``anchor_similarity``; ``adv_opd_B_T`` is ``opd.reverse_kl_advantage``. Never overlaps
    the decisions."""
    keep_B_T = check_b_t(mask_B_T, similarity_B_T=similarity_B_T, adv_opd_B_T=adv_opd_B_T)
    check_number("boost", boost, 0.0)
    cand_B_T = keep_B_T & ~decision_B_T.bool()
    zero = torch.zeros((), dtype=adv_opd_B_T.dtype, device=adv_opd_B_T.device)
    d = row_max_normalised(torch.where(keep_B_T, adv_opd_B_T.detach(), zero).abs(), keep_B_T)
    v = similarity_B_T.detach().to(d.dtype) * (1 + boost * d)
    return top_fraction(v, cand_B_T, r)


def dear_weights(decision_B_T: torch.Tensor, evidence_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                 w_decision: float, w_evidence: float, w_other: float = 0.0, *,
                 unit_mean: bool = True) -> torch.Tensor:
    """Token weights ``weight_B_T`` (detached, 0 where masked) for the OPD loss.

    ``w_decision`` on decisions, ``w_evidence`` on evidence (decisions win if both are set),
    ``w_other`` on the remaining masked tokens. With ``unit_mean`` (the default) they are
    divided by their mean over this call's masked tokens, so a token-mean aggregation computes
    the sketch's ``sum w l / sum w`` when the call holds the whole batch, and the loss scale is
    preserved; all-zero weights stay 0.
    """
    keep_B_T = check_b_t(mask_B_T)
    for name, x in (("w_decision", w_decision), ("w_evidence", w_evidence), ("w_other", w_other)):
        check_number(name, x, 0.0)
    dt = torch.get_default_dtype()
    w = torch.full(keep_B_T.shape, float(w_other), dtype=dt, device=keep_B_T.device)
    w = torch.where(evidence_B_T.bool(), torch.full((), float(w_evidence), dtype=dt), w)
    w = torch.where(decision_B_T.bool(), torch.full((), float(w_decision), dtype=dt), w)
    w = torch.where(keep_B_T, w, torch.zeros((), dtype=dt))
    if unit_mean:
        mean = w.sum() / keep_B_T.sum().clamp(min=1).to(dt)
        w = w / torch.where(mean > 0, mean, torch.ones((), dtype=dt))
    return w
