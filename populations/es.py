"""A functional ES step over a named fp32 parameter set: ``init``, ``ask``, ``tell``.

    state = init(cfg, params)
    for each iteration:
        members = ask(cfg, state)                      # (direction, sign) per member
        rewards_N_P = evaluate(perturbed_params(cfg, state, m) for m in members)
        state, metrics = tell(cfg, state, rewards_N_P)

This is OpenAI ES (Salimans et al. 2017, arXiv 1703.03864) in the simplified form of Qiu et
al. 2025 (arXiv 2509.24372, Alg. 2): theta += lr * (1/N) sum_n w_n s_n eps_n, with 1/sigma in
the learning rate unless ``divide_by_sigma``. Departures from Qiu et al.: optional
antithetic pairs, rank or grouped shaping, Adam, anchored decay, and noise keyed per
tensor name (their per-tensor reseeding with one seed correlates tensors). ``kind`` picks
the perturbation (``populations.perturbations``): full-rank noise, or EGGROLL's rank-r
``A B^T / sqrt(r)`` on matrices (``populations.lowrank``).

Only ``(run_seed, iteration)`` and ``rewards_N_P`` enter ``tell``, so every rank that holds the
same state and rewards computes a bitwise identical next state (seed-only communication).
The state is immutable; ``tell`` returns a new one and never mutates its input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch

from populations.estimators import direction_coefficients
from populations.numbers import is_finite_number
from populations.noise import Member, NoiseFn, check_noise_device, population
from populations.optimizers import OptimizerConfig, OptimizerState, make_optimizer
from populations.perturbations import (VECTOR_MODES, KindInput, Perturbation, kind_names,
                                       perturbation)
from populations.shaping import shape_fitness, shaping_names


@dataclass(frozen=True)
class ESConfig:
    """The model-free ES settings; validated on construction (ValueError)."""

    # Population size N: the rows of rewards_N_P.
    population: int = 30
    # Perturbation scale: member n is evaluated at theta + s_n * sigma * eps_{d_n}.
    sigma: float = 1e-3
    # Mirrored pairs (+eps, -eps) share a direction; needs an even population.
    antithetic: bool = True
    # Registered fitness shaping: zscore, centered_rank, group_zscore, pair_diff or raw.
    shaping: str = "zscore"
    # Divide the estimate by sigma (textbook); False folds 1/sigma into lr as Qiu et al. do.
    divide_by_sigma: bool = False
    # Root of every noise key; with the iteration it fixes every perturbation of the run.
    run_seed: int = 0
    # Update rule applied to the estimate (ascent).
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    # Where noise is drawn: "cpu" (the same values on every machine) or "cuda" (fast on an
    # accelerator, different values; see noise.gaussian).
    noise_device: str = "cpu"
    # Perturbation kind (populations.perturbations): full or lowrank.
    kind: str = "full"
    # Rank r of each matrix's perturbation under kind "lowrank".
    rank: int = 1
    # Non-matrix tensors under kind "lowrank": frozen or full (i.i.d. noise).
    vectors: str = "frozen"

    def __post_init__(self):
        population(self.population, self.antithetic)  # raises on a bad or odd-antithetic N
        if not (is_finite_number(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be a positive number, got {self.sigma!r}")
        if self.shaping not in shaping_names():
            raise ValueError(f"unknown fitness shaping {self.shaping!r}; choose one of "
                             f"{', '.join(shaping_names())}")
        if not isinstance(self.run_seed, int) or isinstance(self.run_seed, bool):
            raise ValueError(f"run_seed must be an int, got {self.run_seed!r}")
        check_noise_device(self.noise_device)
        if not isinstance(self.optimizer, OptimizerConfig):
            raise ValueError(f"optimizer must be an OptimizerConfig, got {self.optimizer!r}")
        if self.kind not in kind_names():
            raise ValueError(f"unknown perturbation kind {self.kind!r}; choose one of "
                             f"{', '.join(kind_names())}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"rank must be an int >= 1, got {self.rank!r}")
        if self.vectors not in VECTOR_MODES:
            raise ValueError(f"unknown vectors mode {self.vectors!r}; choose one of "
                             f"{', '.join(VECTOR_MODES)}")
        if self.shaping == "pair_diff" and not self.antithetic:
            raise ValueError("shaping 'pair_diff' needs antithetic pairs (antithetic=True)")


@dataclass(frozen=True)
class ESState:
    """fp32 master ``params``, the optimizer's state, and the next ``iteration`` to run."""

    params: Mapping[str, torch.Tensor]
    opt: OptimizerState
    iteration: int = 0


def init(cfg: ESConfig, params: Mapping[str, torch.Tensor]) -> ESState:
    """The state before iteration 0: an fp32 copy of ``params`` (any dtype, any device)."""
    master = {k: v.detach().to(torch.float32, copy=True) for k, v in params.items()}
    return ESState(master, make_optimizer(cfg.optimizer).init(master), 0)


def ask(cfg: ESConfig, state: ESState) -> tuple[Member, ...]:
    """The members of ``state.iteration`` in row order of the rewards ``tell`` expects."""
    return population(cfg.population, cfg.antithetic)


def perturbation_of(cfg: ESConfig, iteration: int) -> Perturbation:
    """The perturbation (``cfg.kind``) of ``iteration``: its dense noise and its estimate."""
    return perturbation(cfg.kind, KindInput(cfg.run_seed, iteration, cfg.rank, cfg.vectors,
                                            cfg.noise_device))


def noise_for(cfg: ESConfig, state: ESState) -> NoiseFn:
    """``(direction, name, shape) -> eps`` (fp32) for ``state.iteration``: a member with
    sign s is evaluated at ``theta + s * sigma * eps``."""
    return perturbation_of(cfg, state.iteration).dense


def perturb(theta: torch.Tensor, eps: torch.Tensor, sign: int, sigma: float, *,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    """``theta + sign * sigma * eps`` computed in fp32, then cast to ``dtype`` (default:
    theta's). Built from the fp32 master each time, so "restoring" a low-precision serving
    copy is a re-cast and exact, unlike add-then-subtract in bf16/fp16."""
    out = theta.to(torch.float32) + (sign * sigma) * eps.to(theta.device, torch.float32)
    return out.to(dtype or theta.dtype)


def perturbed_params(cfg: ESConfig, state: ESState, member: Member, *,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of ``member``'s perturbed parameters (for small models and tests; an LLM
    engine perturbs one tensor at a time with ``perturb`` instead)."""
    eps_for = noise_for(cfg, state)
    return {k: perturb(v, eps_for(member.direction, k, v.shape), member.sign, cfg.sigma,
                       dtype=dtype) for k, v in state.params.items()}


def _norm(tensors: Mapping[str, torch.Tensor]) -> float:
    # Sorted names and float64 sums keep the metric independent of dict order.
    return math.sqrt(sum(float(tensors[k].double().square().sum()) for k in sorted(tensors)))


def realised_cosine(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor],
                    dtype: torch.dtype) -> float:
    """Cosine between the intended update ``new - old`` (fp32 masters) and the one a model
    served in ``dtype`` realises, ``cast(new) - cast(old)``, over all tensors. Updates far
    below the dtype's spacing round away (1.0 means nothing was lost; 0.0 that nothing
    moved; es-at-scale saw ~1e-5 updates vanish in bf16)."""
    dot = intended = realised = 0.0
    for k in sorted(old):
        i = (new[k] - old[k]).double()
        r = (new[k].to(dtype).double() - old[k].to(dtype).double())
        dot += float((i * r).sum())
        intended += float(i.square().sum())
        realised += float(r.square().sum())
    if intended == 0.0 or realised == 0.0:
        return 1.0 if intended == realised else 0.0
    return dot / math.sqrt(intended * realised)


def tell(cfg: ESConfig, state: ESState, rewards_N_P: torch.Tensor,
         groups_N_P: torch.Tensor | None = None) -> tuple[ESState, dict[str, float]]:
    """Shape ``rewards_N_P`` (row n = member n of ``ask``), estimate, step; a new state.

    ``groups_N_P`` names the prompt behind each reward when members were scored on different
    prompts (see ``shaping.ShapingInput``); None means column p is prompt p for every member.

    Metrics (floats): ``reward_mean/std/min/max`` over member fitness (mean over prompts),
    ``grad_norm`` of the estimate, ``update_norm`` = ||theta' - theta||, ``param_norm`` =
    ||theta'||, ``update_ratio`` = ||theta' - theta|| / ||theta|| (inf if theta = 0 and the
    update is not), and ``directions`` = noise directions with a non-zero coefficient.
    """
    if rewards_N_P.dim() != 2 or rewards_N_P.shape[0] != cfg.population:
        raise ValueError(f"rewards_N_P must have {cfg.population} rows (one per member), got "
                         f"shape {tuple(rewards_N_P.shape)}")
    weights_N = shape_fitness(cfg.shaping, rewards_N_P, groups_N_P=groups_N_P)
    sigma = cfg.sigma if cfg.divide_by_sigma else None
    coefs = direction_coefficients(weights_N, ask(cfg, state), sigma=sigma)
    pert = perturbation_of(cfg, state.iteration)
    grads = {k: pert.estimate(coefs, k, v.shape, device=v.device)
             for k, v in state.params.items()}
    params, opt = make_optimizer(cfg.optimizer).update(grads, state.opt, state.params)

    fitness_N = rewards_N_P.detach().to("cpu", torch.float64).mean(dim=1)
    update_norm = _norm({k: params[k] - state.params[k] for k in params})
    old_norm = _norm(state.params)
    ratio = update_norm / old_norm if old_norm > 0 else (math.inf if update_norm > 0 else 0.0)
    metrics = {
        "reward_mean": float(fitness_N.mean()),
        "reward_std": float(fitness_N.std(correction=0)),
        "reward_min": float(fitness_N.min()),
        "reward_max": float(fitness_N.max()),
        "grad_norm": _norm(grads),
        "update_norm": update_norm,
        "param_norm": _norm(params),
        "update_ratio": ratio,
        "directions": float(len(coefs)),
    }
    return ESState(params, opt, state.iteration + 1), metrics
