"""Run an evotorch (0.6.x) distribution-based search on a small flat vector, as a reference.

evotorch keeps whole solution vectors (``solution_length``), so it cannot hold LLM-sized
members; it serves here as an independent implementation to test this package's ES against
on toy objectives, and for quick experiments on small parameter vectors.

    result = run_evotorch("pgpe", f, theta0_D, steps=200, popsize=50, stdev=0.1, lr=0.05)

``f(theta_D) -> float`` is *maximised*. evotorch is imported only when a search runs. The
search draws from a generator owned by evotorch's ``Problem`` (seeded with ``seed``), so
torch's global RNG is left alone and equal arguments give equal results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from populations.registry import Registry

_BUILDERS: Registry[Callable[["SearchSetup"], Any]] = Registry("evotorch algorithm")


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
    # Centre learning rate; None = the algorithm's default (ignored by cem).
    lr: float | None
    # Extra keyword arguments for the evotorch class; they override the builder's choices.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchResult:
    """Final centre and best solution seen, their fitness, and the per-generation mean."""

    center_D: torch.Tensor
    center_fitness: float
    best_D: torch.Tensor
    best_fitness: float
    mean_fitness: tuple[float, ...]


def register_evotorch(name: str):
    """Decorator registering ``build(setup: SearchSetup) -> evotorch SearchAlgorithm``."""

    return _BUILDERS.register(name)


def evotorch_names() -> list[str]:
    """The registered algorithm names, sorted."""
    return _BUILDERS.names()


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


def run_evotorch(algorithm: str, f: Callable[[torch.Tensor], float], theta0_D: torch.Tensor,
                 *, steps: int, popsize: int = 50, stdev: float = 0.1, lr: float | None = None,
                 seed: int = 0, options: Mapping[str, Any] | None = None) -> SearchResult:
    """Maximise ``f`` from ``theta0_D`` (shape ``(D,)``, float32 or float64) for ``steps``
    generations of evotorch's ``algorithm``; ``f`` receives a plain CPU tensor of shape (D,).

    Raises ValueError naming the valid algorithms if ``algorithm`` is unknown.
    """
    build = _BUILDERS.get(algorithm)
    if theta0_D.dim() != 1 or not theta0_D.is_floating_point():
        raise ValueError(f"theta0_D must be a 1-D float tensor, got {theta0_D.dtype} of shape "
                         f"{tuple(theta0_D.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    from evotorch import Problem

    def fitness(x) -> float:
        # evotorch hands out read-only views; give the user an ordinary tensor they own.
        return float(f(torch.tensor(x.tolist(), dtype=theta0_D.dtype)))

    problem = Problem("max", fitness, solution_length=theta0_D.numel(), dtype=theta0_D.dtype,
                      seed=seed)
    search = build(SearchSetup(problem, theta0_D.detach().cpu(), popsize, stdev,
                                              lr, dict(options or {})))
    history = []
    for _ in range(steps):
        search.step()
        history.append(float(search.status["mean_eval"]))
    status = search.status
    center = torch.tensor(status["center"].tolist(), dtype=theta0_D.dtype)
    best = torch.tensor(status["best"].values.tolist(), dtype=theta0_D.dtype)
    return SearchResult(center, float(f(center.clone())), best, float(status["best_eval"]),
                        tuple(history))
