"""Low-rank keyed perturbations (EGGROLL, Sarkar et al. 2025, arXiv 2511.16652).

For a matrix parameter W of shape ``(out, in)``, direction d gets factors ``A_d`` (out x r)
and ``B_d`` (in x r) and member (d, s) is evaluated at

    W + s * sigma * E_d,      E_d = A_d B_d^T / sqrt(r).

Each entry of E_d has variance 1 whatever r is (a sum of r products of independent standard
normals, divided by sqrt(r)), so sigma means the same per-entry scale as for full-rank
noise. The factors are one draw of ``(out + in, r)`` standard normals keyed exactly like the
full-rank noise, ``gaussian(noise_key(run_seed, iteration, d, name))``: rows ``:out`` are
A_d and rows ``out:`` are B_d. A ledger therefore replays bitwise.

The estimate over directions with coefficients c_d is sum_d c_d E_d, accumulated in fp32 as
a product of two ``(out, k r)`` and ``(k r, in)`` matrices for chunks of k directions, never
one dense matrix per member.

Departures from EGGROLL: their factors come from a JAX key folded per thread pair; their
update sums score * (sigma A / sqrt(r)) B^T over members and scales it by sqrt(N); here the
update is the project's usual estimate (1/N times the sum, sigma folded into the learning
rate as in Qiu et al. 2025), with E_d in place of full-rank noise.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from populations.noise import gaussian, noise_key

# (direction, tensor name, shape) -> (A_out_r, B_in_r).
FactorFn = Callable[[int, str, torch.Size], tuple[torch.Tensor, torch.Tensor]]

# Directions per matrix product when accumulating the estimate: bounded memory, and a fixed
# grouping keeps the sum's rounding the same on every rank and every run.
ESTIMATE_CHUNK = 256


def check_rank(rank: int, shape: Sequence[int], name: str = "tensor") -> None:
    """ValueError unless ``rank`` is an int in ``[1, min(out, in)]`` for a 2-D ``shape``."""
    if len(shape) != 2:
        raise ValueError(f"low-rank noise needs a matrix; {name} has shape {tuple(shape)}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= min(shape):
        raise ValueError(f"rank must be an int in [1, {min(shape)}] for {name} of shape "
                         f"{tuple(shape)}, got {rank!r}")


def factors(run_seed: int, iteration: int, direction: int, name: str, shape: Sequence[int],
            rank: int, *, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(A_out_r, B_in_r)`` of direction ``direction`` for matrix ``name`` (fp32)."""
    check_rank(rank, shape, name)
    out, inp = shape
    draw = gaussian(noise_key(run_seed, iteration, direction, name), (out + inp, rank),
                    device=device)
    return draw[:out], draw[out:]


def keyed_factors(run_seed: int, iteration: int, rank: int, *,
                  device: str = "cpu") -> FactorFn:
    """The ``factors_for(direction, name, shape)`` callable of one iteration."""

    def factors_for(direction: int, name: str, shape: torch.Size):
        return factors(run_seed, iteration, direction, name, shape, rank, device=device)

    return factors_for


def dense(A_out_r: torch.Tensor, B_in_r: torch.Tensor) -> torch.Tensor:
    """``E = A B^T / sqrt(r)``, shape ``(out, in)``, fp32: the unit perturbation a member
    is evaluated with (times sign * sigma)."""
    r = A_out_r.shape[1]
    return (A_out_r.float() @ B_in_r.float().T) / math.sqrt(r)


def accumulate(coefs: Sequence[tuple[int, float]], name: str, shape: torch.Size,
               factors_for: FactorFn, *, device: torch.device | str | None = None,
               chunk: int = ESTIMATE_CHUNK) -> torch.Tensor:
    """``sum_d c_d A_d B_d^T / sqrt(r)`` as fp32 of ``shape`` on ``device``.

    Directions are taken in the order of ``coefs`` in groups of ``chunk``; each group adds
    ``(A_cat * c) @ B_cat^T / sqrt(r)``, where ``A_cat`` is ``(out, k r)``. Memory: the
    accumulator, one group's factors and one ``(out, in)`` product (the product is not
    accumulated in place; see below).
    """
    acc = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
    for start in range(0, len(coefs), chunk):
        group = coefs[start:start + chunk]
        As, Bs = [], []
        for d, c in group:
            A, B = factors_for(d, name, shape)
            # c is rounded to fp32 when it scales A, as the full-rank sum rounds it.
            As.append(A.to(acc.device, torch.float32) * torch.tensor(c, dtype=torch.float32))
            Bs.append(B.to(acc.device, torch.float32))
        A_cat, B_cat = torch.cat(As, dim=1), torch.cat(Bs, dim=1)
        # A plain product, scaled after: MKL's addmm with alpha != 1 rounded differently
        # with the thread count (an Intel Xeon, 1 vs 2 threads), and mpirun gives each rank
        # a share of the cores, so two ranks missed the serial weights.
        acc.add_(A_cat @ B_cat.T, alpha=1.0 / math.sqrt(As[0].shape[1]))
    return acc
