"""evotorch's (0.6.x) distribution-based searches over a flat parameter vector: PGPE, SNES,
CEM and CMA-ES.

evotorch keeps whole solution vectors (``solution_length`` D): a population of N members is
an (N, D) array, and CMA-ES adds D x D matrices. That rules out LLM-sized parameter sets but
fits an adapter or a few selected tensors, where ``es-llm es`` runs them with
``es.algorithm`` (``es_llm/es/evotorch_loop.py``; ``search_bytes`` is the memory it checks
first). They also serve as an independent implementation to test this package's own ES
against on toy objectives (``tests/test_populations_es.py``). Fitness is *maximised*.
evotorch is imported only when a search is built.
Every search draws from a generator owned by evotorch's ``Problem`` (seeded with ``seed``),
so torch's global RNG is left alone and equal arguments, and equal fitnesses, give equal
searches: which is what lets MPI ranks that each hold the search sample the same population
and apply the same update from gathered fitnesses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from populations.registry import Registry


@dataclass(frozen=True)
class SearchSetup:
    """The one input every algorithm builder takes."""

    # The evotorch Problem wrapping the user's fitness function.
    problem: Any
    # Initial centre of the search distribution, shape (D,).
    center_D: torch.Tensor
    # Solutions sampled per generation.
    popsize: int
    # Initial standard deviation of the search distribution (every coordinate).
    stdev: float
    # Centre learning rate; None = the algorithm's default (ignored by cem and cmaes).
    lr: float | None
    # Extra keyword arguments for the evotorch class; they override the builder's choices.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Algorithm:
    """A registered evotorch algorithm: its builder and the D x D matrices it keeps."""

    build: Callable[[SearchSetup], Any]
    square_matrices: int = 0


_ALGORITHMS: Registry[Algorithm] = Registry("evotorch algorithm")


def register_evotorch(name: str, square_matrices: int = 0):
    """Decorator registering ``build(setup: SearchSetup) -> evotorch SearchAlgorithm``;
    ``square_matrices``: how many D x D arrays the algorithm holds (for ``search_bytes``)."""

    def decorator(build):
        _ALGORITHMS.register(name)(Algorithm(build, square_matrices))
        return build

    return decorator


def evotorch_names() -> list[str]:
    """The registered algorithm names, sorted."""
    return _ALGORITHMS.names()


@register_evotorch("pgpe")
def _pgpe(s: SearchSetup):
    """PGPE (Sehnke et al. 2010) with evotorch's defaults: symmetric (antithetic) sampling,
    centred ranks, ClipUp (Toklu et al. 2020) on the centre; ``lr`` defaults to ``stdev``."""
    from evotorch.algorithms import PGPE

    kwargs = dict(popsize=s.popsize, center_init=s.center_D, stdev_init=s.stdev,
                  center_learning_rate=s.stdev if s.lr is None else s.lr,
                  stdev_learning_rate=0.1)
    return PGPE(s.problem, **{**kwargs, **s.options})


@register_evotorch("snes")
def _snes(s: SearchSetup):
    """Separable NES (Schaul et al. 2011) with NES utilities; evotorch scales the default
    learning rates with the dimension."""
    from evotorch.algorithms import SNES

    kwargs = dict(popsize=s.popsize, center_init=s.center_D, stdev_init=s.stdev)
    if s.lr is not None:
        kwargs["center_learning_rate"] = s.lr
    return SNES(s.problem, **{**kwargs, **s.options})


@register_evotorch("cem")
def _cem(s: SearchSetup):
    """Cross-entropy method (Rubinstein 1999): refit to the best half of each generation."""
    from evotorch.algorithms import CEM

    kwargs = dict(popsize=s.popsize, center_init=s.center_D, stdev_init=s.stdev,
                  parenthood_ratio=0.5)
    return CEM(s.problem, **{**kwargs, **s.options})


@register_evotorch("cmaes", square_matrices=3)
def _cmaes(s: SearchSetup):
    """CMA-ES (Hansen & Ostermeier 2001) with evotorch's defaults (active, step-size
    adaptation): a full D x D covariance, with its eigenvectors and one more matrix of
    working space (so only small D)."""
    from evotorch.algorithms import CMAES

    kwargs = dict(popsize=s.popsize, center_init=s.center_D, stdev_init=s.stdev)
    return CMAES(s.problem, **{**kwargs, **s.options})


def search_bytes(algorithm: str, dimension: int, popsize: int, itemsize: int = 4) -> int:
    """About how many bytes a search of ``algorithm`` over ``dimension`` parameters holds:
    three (popsize, D) arrays (the sampled values, the population's own copy, the
    algorithm's per-sample working array) and its D x D matrices, in ``itemsize``-byte
    numbers. ValueError naming the valid algorithms if ``algorithm`` is unknown."""
    square = _ALGORITHMS.get(algorithm).square_matrices
    return itemsize * (3 * popsize * dimension + square * dimension * dimension)


def make_search(algorithm: str, evaluate_N: Callable[[torch.Tensor], torch.Tensor],
                center_D: torch.Tensor, *, popsize: int, stdev: float, lr: float | None,
                seed: int, options: Mapping[str, Any] | None = None):
    """An evotorch search of ``algorithm`` from ``center_D`` (1-D float tensor), maximising
    ``evaluate_N(values_N_D) -> fitness_N``: called once per ``search.step()`` with the
    whole sampled population (a read-only (N, D) tensor) and returning one fitness per row.

    ValueError naming the valid algorithms if ``algorithm`` is unknown.
    """
    build = _ALGORITHMS.get(algorithm).build
    if center_D.dim() != 1 or not center_D.is_floating_point():
        raise ValueError(f"center_D must be a 1-D float tensor, got {center_D.dtype} of shape "
                         f"{tuple(center_D.shape)}")
    from evotorch import Problem

    # evotorch announces every Problem's dtype and device at INFO level.
    logging.getLogger("evotorch").setLevel(logging.WARNING)
    # initial_bounds only fill the placeholder batch CMA-ES allocates before its first
    # sample; every search here starts from center_D.
    problem = Problem("max", evaluate_N, solution_length=center_D.numel(),
                      dtype=center_D.dtype, seed=seed, vectorized=True,
                      initial_bounds=(-1.0, 1.0))
    return build(SearchSetup(problem, center_D.detach().cpu(), popsize, stdev, lr,
                             dict(options or {})))


def search_center(search) -> torch.Tensor:
    """The centre of ``search``'s distribution, as an ordinary (writable) tensor of shape (D,)."""
    return torch.tensor(search.status["center"].tolist(), dtype=search.problem.dtype)
