"""Fitness shaping: per-member, per-prompt rewards -> one weight per member.

Every variant is registered with ``@register_shaping(name)`` and takes the same
``ShapingInput``; ``shape_fitness(name, rewards_N_P)`` dispatches. Weights are float64, so
ties and small differences survive until the fp32 noise accumulation.

Sign convention: a larger reward is better, and a larger weight pulls the parameters toward
that member's noise (ES maximises reward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from populations.numbers import is_finite_number
from populations.registry import Registry

_SHAPINGS: Registry[Callable[["ShapingInput"], torch.Tensor]] = Registry("fitness shaping")


@dataclass(frozen=True)
class ShapingInput:
    """The one input every shaping function takes.

    ``rewards_N_P[n, p]`` is member n's reward on prompt p (larger is better), any real dtype;
    the shapers compute in float64. Raises ValueError unless it is a finite, non-empty 2-D
    tensor.
    """

    # Member-by-prompt rewards; a member's fitness is its row mean.
    rewards_N_P: torch.Tensor
    # Added to a standard deviation before dividing, so near-constant rewards give large but
    # finite weights; exactly constant rewards give exactly 0 (see the shapers).
    eps: float = 1e-8
    # The prompt behind each reward (any integer ids, shape of rewards_N_P) when members were
    # scored on different prompts; None: column p is the same prompt p for every member.
    groups_N_P: torch.Tensor | None = None

    def __post_init__(self):
        r = self.rewards_N_P
        if not isinstance(r, torch.Tensor) or r.dim() != 2 or r.numel() == 0:
            raise ValueError(f"rewards_N_P must be a non-empty 2-D tensor (members x prompts), "
                             f"got {type(r).__name__} of shape {getattr(r, 'shape', None)}")
        if r.is_complex() or not bool(torch.isfinite(r).all()):
            raise ValueError("rewards_N_P must be real and finite (no NaN or inf)")
        if not (is_finite_number(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be a finite number >= 0, got {self.eps!r}")
        g = self.groups_N_P
        if g is not None and (not isinstance(g, torch.Tensor) or g.shape != r.shape
                              or g.is_floating_point() or g.is_complex()):
            raise ValueError(f"groups_N_P must be an integer tensor of rewards_N_P's shape "
                             f"{tuple(r.shape)}, got {getattr(g, 'shape', g)!r}")

    @property
    def fitness_N(self) -> torch.Tensor:
        """Member fitness: the mean reward over prompts, float64, on the CPU."""
        return self.rewards_N_P.detach().to("cpu", torch.float64).mean(dim=1)


def register_shaping(name: str):
    """Decorator registering ``fn(inp: ShapingInput) -> weights_N`` under ``name``."""

    return _SHAPINGS.register(name)


def shaping_names() -> list[str]:
    """The registered shaping names, sorted."""
    return _SHAPINGS.names()


def shape_fitness(name: str, rewards_N_P: torch.Tensor, *, eps: float = 1e-8,
                  groups_N_P: torch.Tensor | None = None) -> torch.Tensor:
    """``weights_N`` (float64, CPU) of shaping ``name`` applied to ``rewards_N_P``.

    Raises ValueError naming the valid shapings if ``name`` is not registered.
    """
    return _SHAPINGS.get(name)(ShapingInput(rewards_N_P, eps, groups_N_P))


def _centred(x: torch.Tensor, dim: int, eps: float | None = None) -> torch.Tensor:
    """``x - mean`` along ``dim``, divided by ``std + eps`` (population std, ddof=0) unless
    ``eps`` is None. Slices whose values are all equal give exactly 0: the float mean of equal
    values can miss them by an ulp (three 0.1s average to 0.10000000000000002), which would
    leave a spurious update, and with eps = 0 they would give 0 / 0."""
    constant = x.amax(dim=dim, keepdim=True) == x.amin(dim=dim, keepdim=True)
    d = x - x.mean(dim=dim, keepdim=True)
    if eps is not None:
        d = d / (x.std(dim=dim, correction=0, keepdim=True) + eps)
    return torch.where(constant, torch.zeros_like(d), d)


@register_shaping("zscore")
def zscore(inp: ShapingInput) -> torch.Tensor:
    """z-scores of member fitness: ``(f - mean(f)) / (std(f) + eps)``, shape ``(N,)``.

    Qiu et al. 2025 (arXiv 2509.24372), Alg. 2, with f the mean reward over prompts. The std
    is the population std (ddof=0) over the N members; ``eps`` (default 1e-8) is added to the
    std, not to the variance as in EGGROLL's ``sqrt(var + 1e-5)``. Departure: if every member
    has the same fitness the weights are exactly 0 (no update) rather than ~0 / eps.
    """
    return _centred(inp.fitness_N, 0, inp.eps)


@register_shaping("centered_rank")
def centered_rank(inp: ShapingInput) -> torch.Tensor:
    """Centred ranks of member fitness, linear in [-0.5, 0.5], shape ``(N,)``.

    Salimans et al. 2017 (arXiv 1703.03864): the member with rank k (0 = worst) gets
    ``k / (N - 1) - 0.5``. Departure: tied fitnesses get the *average* of the ranks they span,
    so tied members get identical weights. The OpenAI starter and evotorch rank with
    ``argsort``, which orders ties arbitrarily; with binary or sparse LLM rewards most members
    tie and argsort ranks would inject pure noise into the update. Ties are exact float
    equality of the float64 mean rewards. N = 1 gives ``[0.]``.
    """
    f_N = inp.fitness_N
    N = f_N.numel()
    if N == 1:
        return torch.zeros(1, dtype=torch.float64)
    # unique() sorts ascending; a group of c equal values starting at sorted position s spans
    # ranks s .. s+c-1, whose average is s + (c - 1) / 2.
    _, inverse_N, counts = torch.unique(f_N, sorted=True, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    avg_rank = starts.to(torch.float64) + (counts.to(torch.float64) - 1) / 2
    return avg_rank[inverse_N] / (N - 1) - 0.5


@register_shaping("group_zscore")
def group_zscore(inp: ShapingInput) -> torch.Tensor:
    """Per-prompt z-scores averaged over prompts, shape ``(N,)``.

    For each prompt (column) p: ``z[n, p] = (r[n, p] - mean_n r[:, p]) / (std_n r[:, p] + eps)``
    with the population std over members; a column where every member scores the same
    carries no signal and contributes exactly 0. Then ``w[n] = mean_p z[n, p]``.

    With ``groups_N_P`` (members scored on different prompts) a prompt's group is every
    reward with its id, wherever it sits: each reward is standardised within its group and
    ``w[n]`` is the mean over member n's rewards. A prompt only one member saw contributes 0.

    After EGGROLL (arXiv 2511.16652) grouped fitness, which subtracts each group's mean and
    divides by one global std; departure: here each prompt is standardised by its own std,
    like GRPO's group advantages, so easy or hard prompts do not dominate the weight.
    """
    r_N_P = inp.rewards_N_P.detach().to("cpu", torch.float64)
    if inp.groups_N_P is None:
        return _centred(r_N_P, 0, inp.eps).mean(dim=1)
    r, (_, inverse) = r_N_P.flatten(), torch.unique(inp.groups_N_P.flatten().cpu(),
                                                     return_inverse=True)
    G = int(inverse.max()) + 1
    zeros = torch.zeros(G, dtype=torch.float64)
    count = zeros.index_add(0, inverse, torch.ones_like(r))
    mean = zeros.index_add(0, inverse, r) / count
    std = (zeros.index_add(0, inverse, (r - mean[inverse]).square()) / count).sqrt()
    high = torch.full((G,), -math.inf, dtype=torch.float64).scatter_reduce(
        0, inverse, r, "amax")
    low = torch.full((G,), math.inf, dtype=torch.float64).scatter_reduce(0, inverse, r, "amin")
    z = (r - mean[inverse]) / (std[inverse] + inp.eps)
    z = torch.where(high[inverse] == low[inverse], torch.zeros_like(z), z)
    return z.view_as(r_N_P).mean(dim=1)


@register_shaping("pair_diff")
def pair_diff(inp: ShapingInput) -> torch.Tensor:
    """Antithetic paired differences normalised over pairs, shape ``(N,)``.

    Rows 2j and 2j+1 are the +eps and -eps members of pair j (``noise.population``). With
    fitness f and d_j = f_2j - f_2j+1, ``w_2j = d_j / (2 (rms(d) + eps))`` and
    ``w_2j+1 = -w_2j``, so direction j's coefficient is d_j / (rms(d) + eps) / N. When every
    pair is scored on its own prompts this leaves out what z-scores over all members divide
    by: the spread of pair means, which measures how hard each pair's prompts were, not the
    noise. All d_j = 0 gives exactly 0. The project's reading of EGGROLL's per-prompt
    grouping for antithetic pairs; not a published formula.
    """
    f_N = inp.fitness_N
    if f_N.numel() % 2:
        raise ValueError(f"pair_diff needs an even number of members, got {f_N.numel()}")
    d_J = f_N[0::2] - f_N[1::2]
    rms = float(d_J.square().mean().sqrt())
    if rms == 0.0:
        return torch.zeros_like(f_N)
    w_J = d_J / (2 * (rms + inp.eps))
    return torch.stack([w_J, -w_J], dim=1).flatten()


@register_shaping("raw")
def raw(inp: ShapingInput) -> torch.Tensor:
    """Centred fitness ``f - mean(f)``, shape ``(N,)``.

    Keeps the reward scale, so with division by sigma the ES estimate targets the gradient of
    the Gaussian-smoothed objective itself (the textbook estimator). The sample-mean baseline
    shrinks it by (N - 1) / N without mirroring; with antithetic pairs it cancels exactly.
    """
    return _centred(inp.fitness_N, 0)
