"""Perturbation kinds: what a direction's noise is, and how the estimate over directions is
summed. Registered by name with ``@register_kind``; each takes the one ``KindInput``.

- ``full``: every tensor gets i.i.d. keyed Gaussian noise (OpenAI ES, Qiu et al. 2025).
- ``lowrank``: matrices get rank-r noise ``A B^T / sqrt(r)`` (``populations.lowrank``,
  EGGROLL); vectors (norm weights, biases) are frozen or get full-rank noise.

Both key their draws by ``(run_seed, iteration, direction, tensor name)``, so a ledger of
rewards rebuilds any iteration's update bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from populations import estimators, lowrank
from populations.noise import keyed_noise
from populations.registry import Registry

VECTOR_MODES = ("frozen", "full")


@dataclass(frozen=True)
class KindInput:
    """The one input every perturbation kind takes: which iteration's noise, and its form."""

    run_seed: int
    iteration: int
    # Rank r of a matrix's perturbation (lowrank only).
    rank: int = 1
    # Non-matrix tensors under lowrank: "frozen" (no noise, no update) or "full".
    vectors: str = "frozen"
    # Where noise is drawn (see noise.gaussian).
    device: str = "cpu"


class Perturbation(Protocol):
    def dense(self, direction: int, name: str, shape: torch.Size) -> torch.Tensor:
        """The fp32 unit noise of ``direction`` for tensor ``name``: a member with sign s is
        evaluated at ``theta + s * sigma * dense(...)``."""

    def estimate(self, coefs: Sequence[tuple[int, float]], name: str, shape: torch.Size,
                 device=None) -> torch.Tensor:
        """``sum_d c_d * dense(d, name, shape)`` in fp32, without forming every term."""


_KINDS: Registry[Callable[[KindInput], Perturbation]] = Registry("perturbation kind")
register_kind = _KINDS.register
kind_names = _KINDS.names


def perturbation(kind: str, inp: KindInput) -> Perturbation:
    """The perturbation of ``kind`` for ``inp``; ValueError naming the kinds otherwise."""
    return _KINDS.get(kind)(inp)


@dataclass(frozen=True)
class _Full:
    inp: KindInput

    def dense(self, direction, name, shape):
        return keyed_noise(self.inp.run_seed, self.inp.iteration,
                           device=self.inp.device)(direction, name, shape)

    def estimate(self, coefs, name, shape, device=None):
        return estimators.accumulate(coefs, name, shape, self.dense, device=device)


@dataclass(frozen=True)
class _LowRank:
    inp: KindInput

    def factors_for(self, direction, name, shape):
        return lowrank.factors(self.inp.run_seed, self.inp.iteration, direction, name, shape,
                               self.inp.rank, device=self.inp.device)

    def dense(self, direction, name, shape):
        if len(shape) == 2:
            return lowrank.dense(*self.factors_for(direction, name, shape))
        if self.inp.vectors == "full":
            return _Full(self.inp).dense(direction, name, shape)
        return torch.zeros(tuple(shape), dtype=torch.float32)

    def estimate(self, coefs, name, shape, device=None):
        if len(shape) == 2:
            return lowrank.accumulate(coefs, name, shape, self.factors_for, device=device)
        if self.inp.vectors == "full":
            return _Full(self.inp).estimate(coefs, name, shape, device=device)
        return torch.zeros(tuple(shape), dtype=torch.float32, device=device)


@register_kind("full")
def full(inp: KindInput) -> Perturbation:
    """i.i.d. standard normal noise on every tensor."""
    return _Full(inp)


@register_kind("lowrank")
def low_rank(inp: KindInput) -> Perturbation:
    """Rank-``inp.rank`` noise on matrices; vectors per ``inp.vectors``."""
    if inp.vectors not in VECTOR_MODES:
        raise ValueError(f"unknown vectors mode {inp.vectors!r}; choose one of "
                         f"{', '.join(VECTOR_MODES)}")
    return _LowRank(inp)
