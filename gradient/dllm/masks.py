"""Which canvas positions a diffusion-LM log-probability estimate masks, as pure functions.

A diffusion LM has no exact sequence log-probability; RL methods score a completion by
masking some of its positions and reading the model's log-probabilities of the true tokens
there. The methods differ only in which positions they mask:

- ``mean_field_masks`` (d1 / diffu-GRPO, Zhao et al. 2025): the whole completion, plus each
  prompt token with probability ``p_mask_prompt``; one seed per inner iteration, shared by
  the old, new and reference passes so their ratio compares identical perturbations.
- ``trace_rows`` (TraceRL, Wang et al. 2026): the sampler's own trajectory, read from its
  step map (see below).
- ``block_mask_schedule`` + ``sample_block_masks`` (SLIM-RL): random masking at a few
  Gauss-Legendre mask levels with a mean-preserving per-block schedule that decreases across
  blocks (``gauss_legendre``).

Shapes: ``L`` canvas positions, ``K`` blocks of ``block_length``.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def gauss_legendre(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes ``t_n`` and weights ``w_n`` of n-point Gauss-Legendre quadrature on [0, 1]
    (mapped from [-1, 1]: t = (x + 1) / 2, w = w_GL / 2), so ``w.sum() == 1`` and
    ``sum(w f(t))`` integrates polynomials of degree <= 2n - 1 exactly."""
    if n < 1:
        raise ValueError(f"quadrature needs at least one point, got {n}")
    x, w = np.polynomial.legendre.leggauss(n)
    return (x + 1.0) / 2.0, w / 2.0


def block_mask_schedule(t: float, num_blocks: int, spread_cap: float = 0.2) -> np.ndarray:
    """Per-block mask probabilities ``p_K`` around the level t (SLIM-RL).

    ``p_b = t - spread (0.5 (1 - cos(pi x_b)) - 0.5)`` with ``x_b = linspace(0, 1, K)`` and
    ``spread = min(spread_cap, 2 min(t, 1 - t) - 1e-6)``: a cosine ramp from ``t + spread/2``
    (block 0, masked most) down to ``t - spread/2`` (last block), symmetric, so its mean is
    exactly t and every p_b stays inside (0, 1). One block gets t itself.

    Departure: the source writes the ramp increasing and then flips it; the flipped form is
    written out here directly."""
    if not 0.0 < t < 1.0:
        raise ValueError(f"mask level t must lie in (0, 1), got {t}")
    if num_blocks == 1:
        return np.array([t])
    spread = min(spread_cap, 2.0 * min(t, 1.0 - t) - 1e-6)
    x = np.linspace(0.0, 1.0, num_blocks)
    return t - spread * (0.5 * (1.0 - np.cos(math.pi * x)) - 0.5)


def sample_block_masks(valid_B_L: torch.Tensor, block_length: int, p_K, generator: torch.Generator) -> torch.Tensor:
    """Bernoulli masks over valid canvas positions, probability ``p_K[b]`` in block b, with
    at least one masked position per row (the first valid one when the draw gave none)."""
    B, L = valid_B_L.shape
    p_L = torch.as_tensor(np.repeat(np.asarray(p_K, dtype=np.float64), block_length)[:L],
                          dtype=torch.float32)
    masked_B_L = (torch.rand(B, L, generator=generator) < p_L) & valid_B_L
    empty_B = ~masked_B_L.any(dim=-1) & valid_B_L.any(dim=-1)
    first_B = valid_B_L.float().argmax(dim=-1)
    masked_B_L[empty_B, first_B[empty_B]] = True
    return masked_B_L


def mean_field_masks(prompt_B_T: torch.Tensor, canvas_B_T: torch.Tensor, p_mask_prompt: float,
                     seed: int) -> torch.Tensor:
    """d1's perturbation: every canvas position masked, each prompt position with
    probability ``p_mask_prompt``, from a generator seeded with ``seed`` (one per inner
    iteration), so equal seeds give equal masks."""
    generator = torch.Generator().manual_seed(seed)
    draw_B_T = torch.rand(prompt_B_T.shape, generator=generator) < p_mask_prompt
    return canvas_B_T | (prompt_B_T & draw_B_T)


def collapse_steps(step_map_L: list[int], shrink: int) -> list[int]:
    """Merge every ``shrink`` consecutive distinct steps into one (TraceRL's shrinkage):
    fewer training rows, each with more targets. ``shrink = 1`` keeps the map."""
    distinct = sorted(set(s for s in step_map_L if s >= 0))
    merged = {s: distinct[(i // shrink) * shrink] for i, s in enumerate(distinct)}
    return [merged[s] if s >= 0 else s for s in step_map_L]


def trace_rows(step_map_L: list[int], block_length: int, shrink: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """TraceRL's training rows of one completion from its step map, as
    ``(targets_L, masked_L)`` pairs, one per decoding round of each block.

    Within block b, round r takes the block's smallest unconsumed step s: the targets are the
    positions committed at s, and the input masks every position of the block committed at s
    or later, i.e. the canvas exactly as the sampler saw it before step s. Earlier blocks are
    clean, later blocks fully masked (they were all mask tokens while block b decoded).

    Departure: TraceRL packs all blocks' round-r views into one sequence with a block-causal
    attention bias; a bidirectional encoder cannot hide later blocks that way, so each
    (block, round) is its own row and later blocks are masked explicitly. The targets and
    the conditioning are the same; only the number of forward passes differs.
    Positions with step < 0 (not part of the canvas) are never masked or targeted."""
    steps = collapse_steps(step_map_L, shrink)
    L = len(steps)
    step_L = torch.tensor(steps)
    rows = []
    for start in range(0, L, block_length):
        in_block_L = torch.zeros(L, dtype=torch.bool)
        in_block_L[start:start + block_length] = True
        later_L = torch.zeros(L, dtype=torch.bool)
        later_L[start + block_length:] = True
        later_L &= step_L >= 0
        for s in sorted(set(int(x) for x in step_L[in_block_L] if x >= 0)):
            targets_L = in_block_L & (step_L == s)
            masked_L = (in_block_L & (step_L >= s)) | later_L
            rows.append((targets_L, masked_L))
    return rows
