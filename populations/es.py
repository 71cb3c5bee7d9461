"""A functional ES step over a named fp32 parameter set: ``init``, ``ask``, ``tell``.

    state = init(cfg, params, seed)
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

Only the state's ``(seed, iteration)`` and ``rewards_N_P`` enter ``tell``, so every rank
that holds the same state and rewards computes a bitwise identical next state (seed-only
communication).
The state is immutable; ``tell`` returns a new one and never mutates its input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from populations.estimators import direction_coefficients
from populations.evotorch_bridge import evotorch_names
from populations.numbers import is_finite_number
from populations.noise import NOISE_DEVICES, Member, NoiseFn, check_noise_device, population
from populations.optimizers import OptimizerConfig, OptimizerState, make_optimizer
from populations.perturbations import (VECTOR_MODES, KindInput, Perturbation, kind_names,
                                       perturbation)
from populations.settings import SettingError, choice
from populations.shaping import shape_fitness, shaping_names


@dataclass(frozen=True)
class ESConfig(OptimizerConfig):
    """The ES settings: the optimizer's (inherited from ``OptimizerConfig``: ``optimizer``,
    ``lr``, ``betas``, ``eps``, ``anchor_decay``) and the population's below. It is the
    ``es`` section of an ES run's config as it is; validated on construction
    (``SettingError``, a ValueError naming the field)."""

    # The search: es (this module's ES) or an evotorch algorithm (pgpe, snes, cem, cmaes)
    # for parameter sets whose population fits in memory (an adapter, a few tensors); those
    # take population, sigma (their initial stdev) and lr (PGPE's and SNES's centre learning
    # rate) and bring their own sampling, ranking and update.
    algorithm: str = choice("es", lambda: ["es", *evotorch_names()])
    # Population size N (members per iteration; the rows of rewards_N_P); even when
    # antithetic.
    population: int = 30
    # Noise scale: a member's weights are master + sigma * eps.
    sigma: float = 1e-3
    # Mirrored pairs (eps, -eps) share one noise draw.
    antithetic: bool = False
    # Fitness shaping: zscore, centered_rank, group_zscore, pair_diff (antithetic) or raw.
    shaping: str = choice("zscore", shaping_names)
    # Divide the estimate by sigma (textbook); false folds 1/sigma into lr as Qiu et al. do.
    divide_by_sigma: bool = False
    # Where noise is drawn: cpu (the same values on every machine) or cuda (much faster on a
    # GPU, but different values, so a run's ledger then replays only on CUDA machines).
    noise_device: str = choice("cpu", lambda: NOISE_DEVICES)
    # Perturbation: full (i.i.d. noise on every evolving tensor) or lowrank (rank-r noise
    # A B^T / sqrt(r) on matrices, EGGROLL).
    kind: str = choice("full", kind_names)
    # Rank r of each matrix's perturbation with kind=lowrank (at most min(out, in)).
    rank: int = 1
    # With kind=lowrank, non-matrix parameters (norm weights, biases): frozen or full noise.
    vectors: str = choice("frozen", lambda: VECTOR_MODES)

    def __post_init__(self):
        super().__post_init__()  # the optimizer's fields, and every choice field of this one
        try:
            population(self.population, self.antithetic)  # a positive int, even if mirrored
        except ValueError as exc:
            raise SettingError("population", str(exc)) from None
        if self.population < 2:
            raise SettingError("population", "population must be at least 2 (one member gives "
                                             "no estimate)")
        if not (is_finite_number(self.sigma) and self.sigma > 0):
            raise SettingError("sigma", f"sigma must be a positive number, got {self.sigma!r}")
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise SettingError("rank", f"rank must be an int >= 1, got {self.rank!r}")
        if self.algorithm == "pgpe" and self.population % 2:
            raise SettingError("population", f"algorithm pgpe samples symmetric pairs and "
                                             f"needs an even population, got {self.population}")
        if self.shaping == "pair_diff" and not self.antithetic:
            raise SettingError("shaping", "shaping pair_diff needs antithetic pairs "
                                          "(antithetic=true)")
        try:
            check_noise_device(self.noise_device)
        except ValueError as exc:
            raise SettingError("noise_device", str(exc)) from None


@dataclass(frozen=True)
class ESState:
    """fp32 master ``params``, the optimizer's state, the run ``seed`` (the root of every
    noise key: with the iteration it fixes every perturbation of the run) and the next
    ``iteration`` to run."""

    params: Mapping[str, torch.Tensor]
    opt: OptimizerState
    seed: int
    iteration: int = 0


def init(cfg: ESConfig, params: Mapping[str, torch.Tensor], seed: int) -> ESState:
    """The state before iteration 0 of a run seeded ``seed``: an fp32 copy of ``params``
    (any dtype, any device)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    master = {k: v.detach().to(torch.float32, copy=True) for k, v in params.items()}
    return ESState(master, make_optimizer(cfg).init(master), seed, 0)


def ask(cfg: ESConfig, state: ESState) -> tuple[Member, ...]:
    """The members of ``state.iteration`` in row order of the rewards ``tell`` expects."""
    return population(cfg.population, cfg.antithetic)


def perturbation_of(cfg: ESConfig, state: ESState) -> Perturbation:
    """The perturbation (``cfg.kind``) of ``state.iteration``: its dense noise and its
    estimate."""
    return perturbation(cfg.kind, KindInput(state.seed, state.iteration, cfg.rank,
                                            cfg.vectors, cfg.noise_device))


def noise_for(cfg: ESConfig, state: ESState) -> NoiseFn:
    """``(direction, name, shape) -> eps`` (fp32) for ``state.iteration``: a member with
    sign s is evaluated at ``theta + s * sigma * eps``."""
    return perturbation_of(cfg, state).dense


def perturb(theta: torch.Tensor, eps: torch.Tensor, sign: int, sigma: float, *,
            dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``theta + sign * sigma * eps`` computed in fp32, then cast to ``dtype`` (default:
    theta's, or ``out``'s): one tensor of a member's weights, the one function that computes
    them (the engine writes each served tensor with it, ``es_llm.es.weights``). Built from the
    fp32 master each time, so "restoring" a low-precision serving copy is a re-cast and exact,
    unlike add-then-subtract in bf16/fp16.

    ``out`` (theta's shape): written in place and returned, so a caller that writes a member
    per evaluation reuses one buffer instead of touching fresh memory each time (at
    Qwen2.5-0.5B's size, freshly mapped pages cost more than the arithmetic). The bits are the
    same either way: ``sign * sigma * eps`` is rounded first, then added, and IEEE addition
    commutes.
    """
    eps = eps.to(theta.device, torch.float32)
    if (out is not None and out.dtype == theta.dtype == (dtype or torch.float32) == torch.float32
            and out.device == theta.device):
        return torch.mul(eps, sign * sigma, out=out).add_(theta)
    member = (theta.to(torch.float32) + (sign * sigma) * eps).to(
        dtype or (theta.dtype if out is None else out.dtype))
    return member if out is None else out.copy_(member)


def perturbed_params(cfg: ESConfig, state: ESState, member: Member, *,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of ``member``'s perturbed parameters at once (a small model's whole
    member, as ``scripts/minimal_es.py`` evaluates it; an LLM engine writes one served
    tensor at a time with ``perturb`` instead)."""
    eps_for = noise_for(cfg, state)
    return {k: perturb(v, eps_for(member.direction, k, v.shape), member.sign, cfg.sigma,
                       dtype=dtype) for k, v in state.params.items()}


def _norm(tensors: Mapping[str, torch.Tensor]) -> float:
    # Sorted names and a float64 sum over tensors keep the metric independent of dict order.
    return math.sqrt(sum(_square_sum(tensors[k]) for k in sorted(tensors)))


# Elements per block of ``_square_sum``: fp32 sums of this many squares are accurate to ~1e-7.
_BLOCK = 1 << 16


def _square_sum(t: torch.Tensor) -> float:
    """The sum of ``t``'s squares, to ~1e-7 relative: fp32 norms of blocks of ``_BLOCK``
    elements, summed in float64. A float64 copy of every tensor cost three quarters of an
    update at Qiu et al.'s 0.5B size (``scripts/bench_es.py``); one fp32 norm of a whole
    136M-element tensor is off by 3% in torch 2.13."""
    flat = t.detach().reshape(-1)
    cut = flat.numel() - flat.numel() % _BLOCK
    blocks = torch.linalg.vector_norm(flat[:cut].view(-1, _BLOCK).float(), dim=1)
    return float(blocks.double().square().sum()) + float(flat[cut:].double().square().sum())


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
    pert = perturbation_of(cfg, state)
    grads = {k: pert.estimate(coefs, k, v.shape, device=v.device)
             for k, v in state.params.items()}
    params, opt = make_optimizer(cfg).update(grads, state.opt, state.params)

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
    return ESState(params, opt, state.seed, state.iteration + 1), metrics
