"""AVSD: a consensus target over several privileged views, with a bounded Jensen residual.

Nguyen et al. 2026, Adaptive-View Self-Distillation (arXiv 2605.20643; code
duykhuongnguyen/AVSD ``src/avsd/common/multiview_distill.py``). The same model, shown M
privileged views of the problem (full solution, partial solution, answer only, ...), scores
the student's rollout; at each position the views' log-probs live on a candidate support C
(the union of the per-view top-K and the sampled token) and are renormalised over it.

Suffixes: ``_M`` views, ``_C`` candidates of the support (padded; ``support_B_T_C`` marks the
real ones).
"""

from __future__ import annotations

import math

import torch

from gradient.distill.opd import check_number


def _support_log_softmax(x: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the supported entries of the last dimension, 0 elsewhere; a position
    with no support gives all 0 (no -inf ever reaches the arithmetic)."""
    any_ = support.any(-1, keepdim=True)
    eff = support | ~any_
    ninf = torch.full((), -math.inf, dtype=x.dtype, device=x.device)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    lsm = torch.where(eff, torch.where(eff, x, zero), ninf).log_softmax(-1)
    return torch.where(support, lsm, zero)


def _check(view_logp_M_B_T_C, student_logp_B_T_C, support_B_T_C, mask_B_T):
    if not (isinstance(student_logp_B_T_C, torch.Tensor) and student_logp_B_T_C.dim() == 3
            and student_logp_B_T_C.dtype.is_floating_point):
        raise ValueError("student_logp_B_T_C must be a floating (B, T, C) tensor")
    shape = student_logp_B_T_C.shape
    if not (isinstance(view_logp_M_B_T_C, torch.Tensor) and view_logp_M_B_T_C.dim() == 4
            and view_logp_M_B_T_C.shape[1:] == shape and view_logp_M_B_T_C.shape[0] >= 1
            and view_logp_M_B_T_C.dtype.is_floating_point):
        raise ValueError(f"view_logp_M_B_T_C must be a floating (M, B, T, C) tensor with "
                         f"(B, T, C) = {tuple(shape)}")
    if not (isinstance(support_B_T_C, torch.Tensor) and support_B_T_C.shape == shape):
        raise ValueError(f"support_B_T_C must have shape {tuple(shape)}")
    if not (isinstance(mask_B_T, torch.Tensor) and mask_B_T.shape == shape[:2]):
        raise ValueError(f"mask_B_T must have shape {tuple(shape[:2])}")


def avsd_target(view_logp_M_B_T_C: torch.Tensor, student_logp_B_T_C: torch.Tensor,
                support_B_T_C: torch.Tensor, mask_B_T: torch.Tensor, *,
                weights_M: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The AVSD target ``log q*`` on the candidate support, and its parts; all detached.

    Inputs (log-probs or logits; each is renormalised over the support with a masked
    log-softmax, as the reference code does): ``view_logp_M_B_T_C`` the teacher views,
    ``student_logp_B_T_C`` the student p, ``support_B_T_C`` the real candidates,
    ``weights_M`` the view weights (default uniform; AVSD's "agreement_centrality" weights
    ``softmax(-eta * mean pairwise JSD)`` are computed by the caller and passed here).
    ``(B, T, C)`` outputs, 0 outside the support and at masked positions:

    - ``consensus``: log q_G = log-softmax(sum_m w_m log q^(m)) (geometric consensus);
    - ``residual``: J = max(log q_A - log q_G, 0), q_A = sum_m w_m q^(m) renormalised;
    - ``adv_mean``: the consensus advantage sum_m w_m (log q^(m) - log p);
    - ``gate``: lambda = C R with C = |adv_mean| / sum_m w_m |log q^(m) - log p| (sign
      agreement) and R = |adv_mean| / (|adv_mean| + J); C := 0 and R := 0 where their
      denominators are 0;
    - ``target``: log q* = log-softmax(log q_G + lambda J).

    Bound: ``lambda J = C |adv_mean| J / (|adv_mean| + J) <= C |adv_mean| <= |adv_mean|``
    (C <= 1 by the triangle inequality with weights summing to 1), so adding the residual
    never flips the sign of the consensus advantage at any candidate. Note that this holds
    for ``adv_mean``, the consensus advantage before q_G is renormalised (the reference's
    "A^G"); log q_G - log p differs from it by a constant per position.
    """
    _check(view_logp_M_B_T_C, student_logp_B_T_C, support_B_T_C, mask_B_T)
    M = view_logp_M_B_T_C.shape[0]
    dtype = torch.promote_types(student_logp_B_T_C.dtype, torch.float32)
    dev = student_logp_B_T_C.device
    if weights_M is None:
        w_M = torch.full((M,), 1.0 / M, dtype=dtype, device=dev)
    else:
        if not (isinstance(weights_M, torch.Tensor) and weights_M.shape == (M,)):
            raise ValueError(f"weights_M must have shape ({M},)")
        w_M = weights_M.detach().to(dtype)
        w_M = w_M / w_M.sum()
    sup = support_B_T_C.bool() & mask_B_T.bool()[..., None]
    zero = torch.zeros((), dtype=dtype, device=dev)
    q_M = _support_log_softmax(view_logp_M_B_T_C.detach().to(dtype),
                               sup[None].expand(M, -1, -1, -1))
    p = _support_log_softmax(student_logp_B_T_C.detach().to(dtype), sup)
    w = w_M[:, None, None, None]
    geo = (w * q_M).sum(0)
    log_qG = _support_log_softmax(geo, sup)
    # log of sum_m w_m q^(m): logsumexp of log w + log q; renormalised over the support.
    log_qA = _support_log_softmax(torch.logsumexp(torch.log(w) + q_M, dim=0), sup)
    J = torch.where(sup, (log_qA - log_qG).clamp(min=0), zero)
    delta_M = q_M - p[None]
    adv_mean = (w * delta_M).sum(0)
    spread = (w * delta_M.abs()).sum(0)
    a = adv_mean.abs()
    C = torch.where(spread > 0, a / torch.where(spread > 0, spread, 1.0), zero)
    R = torch.where(a + J > 0, a / torch.where(a + J > 0, a + J, 1.0), zero)
    lam = torch.where(sup, C * R, zero)
    target = _support_log_softmax(log_qG + lam * J, sup)
    return {"consensus": log_qG, "residual": J, "adv_mean": torch.where(sup, adv_mean, zero),
            "gate": lam, "target": target}


def jensen_bound_holds(parts: dict[str, torch.Tensor], rtol: float = 1e-6) -> torch.Tensor:
    """0-d bool tensor: ``gate * residual <= |adv_mean|`` everywhere (up to ``rtol``), a
    detached diagnostic of ``avsd_target``'s output for the trainer's metrics."""
    check_number("rtol", rtol, 0.0)
    lhs = parts["gate"] * parts["residual"]
    a = parts["adv_mean"].abs()
    return (lhs <= a * (1 + rtol) + rtol).all()
