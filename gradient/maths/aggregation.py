"""Loss aggregation: a per-token ``loss_B_T`` -> the scalar that is back-propagated.

How the token losses are normalised is the largest silent difference between "GRPO"
implementations (TRL's default divides by the active tokens of the global batch, verl's by
global tokens, the GRPO paper by each sequence's length, Dr. GRPO by a constant), so the mode
is always named explicitly. Every mode is registered with ``@register_aggregation(name)`` and
takes the same ``AggregationInput``; ``aggregate(...)`` dispatches.

Global divisors: ``global_tokens`` and ``global_seqs`` count the whole optimizer step (all
micro-batches), and the trainer computes them over the whole step before the first backward
(the tokens its log-prob estimator scores, ``gradient.dllm.estimators.scored_tokens``, and
the rows). Each micro-batch then contributes its share of one global mean, so summing
micro-batch gradients (and averaging nothing) reproduces the full-batch gradient, whatever
the micro-batch size. The trainer is single-process; a data-parallel one would sum the counts
over its ranks the same way and then *sum* gradients over ranks (or multiply by the world
size before an averaging allreduce), so the world size would still never enter this module.

Masking: positions where ``mask_B_T`` is 0 are replaced by 0 before summing, so any finite
or infinite garbage there cannot reach the result or the gradient, and a row with no tokens
in the loss contributes exactly 0 (no 0 / 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from populations.registry import Registry

_AGGREGATIONS: Registry[Callable[["AggregationInput"], torch.Tensor]] = Registry(
    "aggregation mode")


def _check_divisor(name: str, x, *, optional: bool = False) -> None:
    """A positive finite number, or a 0-d tensor (value not checked: no host sync)."""
    if x is None and optional:
        return
    if isinstance(x, torch.Tensor) and x.dim() == 0:
        return
    if not (isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf):
        raise ValueError(f"{name} must be a positive finite number (a count over the whole "
                         f"optimizer step), got {x!r}")


@dataclass(frozen=True)
class AggregationInput:
    """The one input every aggregation mode takes. Raises ValueError on bad shapes or
    divisors; a mode that needs ``constant`` raises if it is None."""

    # Per-token losses, B rows by T tokens.
    loss_B_T: torch.Tensor
    # Nonzero where the token is in the loss.
    mask_B_T: torch.Tensor
    # Tokens in the loss over the whole optimizer step (all micro-batches, all ranks).
    global_tokens: float
    # Sequences (rows) over the whole optimizer step.
    global_seqs: float
    # The fixed divisor of seq-mean-token-sum-norm; None for the other modes.
    constant: float | None = None

    def __post_init__(self):
        loss = self.loss_B_T
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 2
                and loss.dtype.is_floating_point):
            raise ValueError(f"loss_B_T must be a 2-D floating tensor, got "
                             f"{getattr(loss, 'shape', type(loss))}")
        if not isinstance(self.mask_B_T, torch.Tensor) or self.mask_B_T.shape != loss.shape:
            raise ValueError(f"mask_B_T must be a tensor of loss_B_T's shape {tuple(loss.shape)}, "
                             f"got {getattr(self.mask_B_T, 'shape', type(self.mask_B_T))}")
        _check_divisor("global_tokens", self.global_tokens)
        _check_divisor("global_seqs", self.global_seqs)
        _check_divisor("constant", self.constant, optional=True)

    def kept(self) -> torch.Tensor:
        """``loss_B_T`` with every masked position replaced by exactly 0."""
        return torch.where(self.mask_B_T != 0, self.loss_B_T, torch.zeros_like(self.loss_B_T))


def register_aggregation(name: str):
    """Decorator registering ``fn(inp: AggregationInput) -> scalar`` under ``name``."""
    return _AGGREGATIONS.register(name)


def aggregation_names() -> list[str]:
    """The registered aggregation modes, sorted."""
    return _AGGREGATIONS.names()


def aggregate(loss_B_T: torch.Tensor, mask_B_T: torch.Tensor, mode: str, *, global_tokens: float,
              global_seqs: float, constant: float | None = None) -> torch.Tensor:
    """This micro-batch's share of the step loss under ``mode``: a 0-d tensor.

    Raises ValueError naming the valid modes if ``mode`` is not registered.
    """
    return _AGGREGATIONS.get(mode)(AggregationInput(loss_B_T, mask_B_T, global_tokens, global_seqs,
                                                constant))


@register_aggregation("token-mean")
def token_mean(inp: AggregationInput) -> torch.Tensor:
    """``sum_{i,t} m L / global_tokens``: every token of the step weighs the same.

    DAPO's token-level normalisation (arXiv 2503.14476), TRL's default ("dapo"), verl's
    default. Long sequences carry proportionally more weight.
    """
    return inp.kept().sum() / inp.global_tokens


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(inp: AggregationInput) -> torch.Tensor:
    """``sum_i (sum_t m L / sum_t m) / global_seqs``: each sequence's token mean, averaged.

    The original GRPO objective (arXiv 2402.03300) and the mode under which ``gspo`` equals
    GSPO. Dr. GRPO (arXiv 2503.20783) points out its length bias: a token of a short sequence
    weighs more, so short correct and long wrong answers are both favoured.
    """
    keep_B_T = inp.mask_B_T != 0
    per_row_B = inp.kept().sum(dim=1) / keep_B_T.sum(dim=1).clamp(min=1)
    return per_row_B.sum() / inp.global_seqs


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(inp: AggregationInput) -> torch.Tensor:
    """``sum_i sum_t m L / global_seqs``: each sequence's token sum, averaged (verl mode)."""
    return inp.kept().sum() / inp.global_seqs


@register_aggregation("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(inp: AggregationInput) -> torch.Tensor:
    """``sum_{i,t} m L / constant``: Dr. GRPO's constant normaliser (arXiv 2503.20783).

    ``constant`` is the whole divisor and must not depend on the sampled lengths. For TRL's
    ``dr_grpo`` (``B * max_completion_length``) over a whole step pass
    ``constant = max_completion_length * global_seqs``: the mean over sequences of each token
    sum divided by the generation budget. verl's mode is the same mean: each sequence's token
    sum divided by its ``loss_scale_factor`` (default the max response length), averaged over
    the sequences; pass ``constant = loss_scale_factor * global_seqs`` to reproduce it (with
    ``loss_scale_factor`` alone the loss would be ``global_seqs`` times verl's).
    """
    if inp.constant is None:
        raise ValueError("seq-mean-token-sum-norm needs constant, the fixed divisor (e.g. "
                         "max_completion_length * global_seqs)")
    return inp.kept().sum() / inp.constant
