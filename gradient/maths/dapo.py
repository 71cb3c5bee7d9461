"""DAPO's data-side pieces: dynamic sampling (drop zero-variance groups) and overlong shaping.

Yu et al. 2025, DAPO (arXiv 2503.14476). The loss-side pieces live elsewhere: clip-higher is
``LossInput.clip_high > clip_low`` and token-level normalisation is the ``token-mean``
aggregation.
"""

from __future__ import annotations

import math

import torch


def _check_rewards(rewards_P_G: torch.Tensor) -> None:
    if not isinstance(rewards_P_G, torch.Tensor) or rewards_P_G.dim() != 2:
        raise ValueError(f"rewards_P_G must be a 2-D tensor (prompts x rollouts), got "
                         f"{getattr(rewards_P_G, 'shape', type(rewards_P_G))}")


def zero_variance_groups(rewards_P_G: torch.Tensor) -> torch.Tensor:
    """``bool_P``: True where every rollout of prompt p has exactly the same reward.

    Exact equality, not a tolerance: such a group has every advantage 0 (see
    ``gradient.maths.advantages``) and contributes no policy gradient, only dilutes the batch.
    A group of one rollout counts as zero-variance.
    """
    _check_rewards(rewards_P_G)
    return (rewards_P_G == rewards_P_G[:, :1]).all(dim=1)


def keep_groups(rewards_P_G: torch.Tensor, limit: int | None = None) -> torch.Tensor:
    """Indices (int64, ascending) of the groups DAPO's dynamic sampling keeps.

    The groups that are not zero-variance, in their original order, cut to the first
    ``limit`` when given (DAPO fills a fixed train batch of ``limit`` prompts). When fewer
    survive, all survivors are returned and the trainer generates another batch and calls
    this again on the concatenation (DAPO's ``max_num_gen_batches`` loop lives there).
    """
    if limit is not None and not (isinstance(limit, int) and not isinstance(limit, bool)
                                  and limit >= 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    keep_P = ~zero_variance_groups(rewards_P_G)
    idx = torch.nonzero(keep_P, as_tuple=False).flatten()
    return idx if limit is None else idx[:limit]


def overlong_penalty(lengths_B: torch.Tensor, max_len: int, buffer_len: int,
                     penalty_factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward: ``penalty_B`` (float64, <= 0).

    With ``expected = max_len - buffer_len`` (the length budget without penalty):
    ``penalty = -(len - expected) / buffer_len * penalty_factor`` for ``len > expected``,
    0 otherwise, clamped below at ``-penalty_factor``. It falls linearly from 0 at
    ``expected`` to ``-penalty_factor`` at ``max_len`` (the paper's R_len with factor 1;
    verl's ``overlong_buffer``). The clamp only matters for lengths above ``max_len``, which
    a generator capped at ``max_len`` never produces; there the paper's value is -1 too.
    ``lengths_B`` counts generated tokens (including EOS, as the engine reports them).
    """
    if not (isinstance(max_len, int) and not isinstance(max_len, bool) and max_len >= 1):
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    if not (isinstance(buffer_len, int) and not isinstance(buffer_len, bool)
            and 0 < buffer_len <= max_len):
        raise ValueError(f"buffer_len must be an integer in (0, max_len] = (0, {max_len}], "
                         f"got {buffer_len!r}")
    if not (isinstance(penalty_factor, (int, float)) and not isinstance(penalty_factor, bool)
            and 0 <= penalty_factor < math.inf):
        raise ValueError(f"penalty_factor must be a finite number >= 0, got {penalty_factor!r}")
    if not isinstance(lengths_B, torch.Tensor) or lengths_B.dim() != 1:
        raise ValueError(f"lengths_B must be a 1-D tensor, got "
                         f"{getattr(lengths_B, 'shape', type(lengths_B))}")
    expected = max_len - buffer_len
    over_B = lengths_B.to(torch.float64) - expected
    penalty_B = (-over_B / buffer_len * penalty_factor).clamp(min=-float(penalty_factor))
    # where() rather than a clamp at 0 so lengths within budget give +0.0, not -0.0.
    return torch.where(over_B > 0, penalty_B, torch.zeros_like(penalty_B))
