"""Blockwise policy-drift gates for OPD on reused rollouts (BPDG).

Zheng & Jiang 2026, Blockwise Policy-Drift Gating (arXiv 2606.24084), section 3, Eq. 1. When
rollouts from an older behaviour student pi_b are reused, the token drift is
``delta_t = log pi_b(o_t) - log pi_theta(o_t)``; each block b of positions gets

    g_b = exp(-tau * |mean_{t in b} delta_t|)      (detached),

normalised to unit mean, and the OPD loss becomes ``sum_t g_t l_t / (same token denominator)``.
Teacher targets, top-K support and the rollout policy are unchanged. When the current student
equals the behaviour one every gate is 1.
"""

from __future__ import annotations

import torch

from gradient.distill.opd import check_b_t, check_number

_UNIT_MEAN = ("tokens", "blocks")


def drift_gates(current_logp_B_T: torch.Tensor, behaviour_logp_B_T: torch.Tensor,
                mask_B_T: torch.Tensor, block_size: int, tau: float, *,
                unit_mean_over: str = "tokens") -> torch.Tensor:
    """Per-token gates ``gate_B_T`` (detached, 0 at masked positions), shape ``(B, T)``.

    ``current_logp_B_T``: log-probs of the sampled tokens under the student being trained;
    ``behaviour_logp_B_T``: under the student that generated them (the trainer's
    ``old_logp_B_T``). Blocks are consecutive runs of ``block_size`` columns of each row
    (the paper's best is 64), so column 0 must be the first generated token; the last block
    of a row may be shorter. A block's drift is the mean of ``delta_t`` over its masked
    tokens; blocks without masked tokens get no gate.

    Normalisation, over all blocks of this call (the paper: "unit mean over the valid
    positions"): ``unit_mean_over="tokens"`` makes the gates average 1 over masked tokens, so
    the token-mean loss scale is preserved; ``"blocks"`` makes them average 1 over blocks
    that hold tokens. The two agree when every block is full. With no masked token at all
    the gates are all 0.

    Project's reading: the paper's normalisation scope (micro-batch, batch or row) is not
    given; here it is the tensors passed in, i.e. one call. The paper also allows spans
    instead of fixed blocks; only fixed blocks are here.
    """
    keep_B_T = check_b_t(mask_B_T, current_logp_B_T=current_logp_B_T,
                         behaviour_logp_B_T=behaviour_logp_B_T)
    if not (isinstance(block_size, int) and not isinstance(block_size, bool) and block_size >= 1):
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    check_number("tau", tau, 0.0)
    if unit_mean_over not in _UNIT_MEAN:
        raise ValueError(f"unit_mean_over must be one of {', '.join(_UNIT_MEAN)}, got "
                         f"{unit_mean_over!r}")
    cur = current_logp_B_T.detach()
    dtype = torch.promote_types(cur.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=cur.device)
    delta_B_T = (torch.where(keep_B_T, behaviour_logp_B_T.detach().to(dtype), zero)
                 - torch.where(keep_B_T, cur.to(dtype), zero))
    B, T = keep_B_T.shape
    n_blocks = -(-T // block_size)
    pad = n_blocks * block_size - T
    delta_B_N_S = torch.nn.functional.pad(delta_B_T, (0, pad)).view(B, n_blocks, block_size)
    count_B_N = torch.nn.functional.pad(keep_B_T.to(dtype), (0, pad)).view(
        B, n_blocks, block_size).sum(-1)
    has_B_N = count_B_N > 0
    mean_B_N = delta_B_N_S.sum(-1) / count_B_N.clamp(min=1)
    g_B_N = torch.where(has_B_N, torch.exp(-tau * mean_B_N.abs()), zero)
    if unit_mean_over == "tokens":
        denom = (g_B_N * count_B_N).sum() / count_B_N.sum().clamp(min=1)
    else:
        denom = g_B_N.sum() / has_B_N.sum().clamp(min=1).to(dtype)
    # denom > 0 whenever a block holds tokens (each gate is exp(.) > 0 unless it underflows).
    gate_B_N = g_B_N / denom.clamp(min=torch.finfo(dtype).tiny)
    gate_B_T = gate_B_N.repeat_interleave(block_size, dim=1)[:, :T]
    return torch.where(keep_B_T, gate_B_T, zero)
