"""``es.algorithm=pgpe|snes|cem|cmaes``: one of evotorch's distribution-based searches
(``populations.evotorch_bridge``) drives ``es-llm es`` over a parameter set small enough
that its population fits in memory: an adapter (``lora.enabled``) or a few tensors
(``engine.params``).

Every rank builds the same search from the same start and the run seed, so every rank
samples the same population; each evaluates its share (member n on rank n % P) with the
same backends, prompts and task as es-llm's own ES, the ranks gather the rewards (the only
exchange, as in the own ES) and every rank's search takes the same step. The ledger records
each iteration's fitnesses, and ``--resume`` feeds them to a fresh search from the same
start: evotorch draws every sample from its Problem's seeded generator, so the replay
rebuilds the search distribution bitwise, on the same machine type.

How this differs from the own ES: members are explicit vectors (evotorch holds the (N, D)
population, ``search_bytes``), written into the served weights one member at a time
(``engine.serve=weights``; no keyed noise, so rows cannot serve them and nothing is
regenerated from seeds); a member's fitness is its mean reward over its prompts, and the
shaping, sampling and update are evotorch's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from es_llm.errors import BadInput, NonFinite
from es_llm.es.config import ESRunConfig
from es_llm.es.engine import (Edges, Search, gather, generated_tokens, member_prompts,
                              member_sampling, owned_members, prompt_batch, score_served)
from es_llm.finite import Diverged, check
from es_llm.tasks import Problem
from populations.evotorch_bridge import make_search, search_bytes, search_center
from populations.noise import population

# A search may hold at most this share of the memory free when the run starts: the model,
# its engine and the generations need the rest.
MEMORY_SHARE = 0.5


class _Fitness:
    """The fitness function the evotorch Problem calls; a step sets what it evaluates."""

    def __init__(self):
        self.evaluate = None

    def __call__(self, values_N_D: torch.Tensor) -> torch.Tensor:
        return self.evaluate(values_N_D)


@dataclass
class SearchState:
    """The evotorch search, how its flat vector maps onto the named tensors, the next
    iteration and the centre as named fp32 tensors (what the served weights hold)."""

    search: object
    layout: tuple[tuple[str, torch.Size], ...]
    fitness: _Fitness
    params: dict[str, torch.Tensor]
    iteration: int = 0


def flatten(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensors, in their order, as one fp32 vector of shape (D,)."""
    return torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors.values()])


def unflatten(vector_D: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """The inverse of ``flatten`` for the names and shapes of ``layout``."""
    out, at = {}, 0
    for name, shape in layout:
        n = math.prod(shape)
        out[name] = vector_D[at:at + n].reshape(shape)
        at += n
    return out


def check_search_fits(cfg: ESRunConfig, master: dict[str, torch.Tensor]) -> None:
    """BadInput, naming the bytes, when the search over ``master``'s parameters would take
    more than ``MEMORY_SHARE`` of the memory free now."""
    import psutil

    dimension = sum(t.numel() for t in master.values())
    need = search_bytes(cfg.es.algorithm, dimension, cfg.es.population)
    free = psutil.virtual_memory().available
    if need > MEMORY_SHARE * free:
        square = " + 3 D x D matrices" if cfg.es.algorithm == "cmaes" else ""
        raise BadInput(
            f"es.algorithm={cfg.es.algorithm} over D = {dimension:,} evolving parameters with "
            f"es.population={cfg.es.population} would hold about {need / 2**30:,.1f} GiB "
            f"(3 x population x D{square}, 4 bytes each: {need:,} bytes), more than half "
            f"of the {free / 2**30:,.1f} GiB free on this machine. Evolve fewer parameters "
            f"(lora.enabled=true, or engine.params=regex with a narrower "
            f"engine.param_pattern), lower es.population, or use es.algorithm=es, which "
            f"never holds the population (its members are regenerated from seeds).")


def init(cfg: ESRunConfig, edges: Edges) -> SearchState:
    """The search before iteration 0, centred on the evolving tensors' fp32 master."""
    master = dict(edges.weights.master)
    fitness = _Fitness()
    search = make_search(cfg.es.algorithm, fitness, flatten(master), popsize=cfg.es.population,
                         stdev=cfg.es.sigma, lr=cfg.es.lr, seed=cfg.seed)
    return SearchState(search, tuple((n, t.shape) for n, t in master.items()), fitness, master)


def _vector_served(edges: Edges, state: SearchState, values_N_D: torch.Tensor, mine, batch,
                   assigned, params):
    """``(member, problems, completions)`` for each member this rank owns, its row of the
    population written as the evolving tensors (then the centre again)."""
    try:
        for m in mine:
            edges.weights.set_master(unflatten(values_N_D[m.index].clone(), state.layout))
            problems = [batch[i] for i in assigned[m.index]]
            completions = edges.backend.generate([p.prompt for p in problems], params,
                                                 keys=[p.id for p in problems])
            yield m, problems, [c[0] for c in completions]
    finally:
        edges.weights.set_master(state.params)


def step(edges: Edges, state: SearchState, problems: list[Problem], cfg: ESRunConfig):
    """One generation: sample, evaluate across ranks, the search's update; returns the
    state, the metrics and the ledger entry."""
    t0 = time.perf_counter()
    members = population(cfg.es.population, False)
    batch = prompt_batch(problems, cfg, state.iteration)
    assigned = member_prompts(members, len(batch), cfg.engine.prompts_per_member)
    mine = owned_members(members, edges.comm.rank, edges.comm.size)
    seen: dict = {}

    def evaluate(values_N_D: torch.Tensor) -> torch.Tensor:
        plain = values_N_D.as_subclass(torch.Tensor)
        gathered = gather(edges.comm, score_served(edges, _vector_served(
            edges, state, plain, mine, batch, assigned, member_sampling(cfg))))
        seen["gathered"] = gathered
        seen["rewards_N_P"] = torch.tensor([gathered[n][0] for n in range(len(members))],
                                           dtype=torch.float64)
        return seen["rewards_N_P"].mean(dim=1).to(torch.float32)

    moved = state.iteration > 0
    state.fitness.evaluate = evaluate
    try:
        state.search.step()
    except NonFinite:
        raise Diverged("next-token logits", "es/logits", math.nan, moved) from None
    finally:
        state.fitness.evaluate = None
    rewards_N_P, gathered = seen["rewards_N_P"], seen["gathered"]
    check("reward", "es/reward_mean", float(rewards_N_P.sum()), moved)
    metrics = _moved(state, rewards_N_P, edges)
    fitness_N = rewards_N_P.mean(dim=1).to(torch.float32)
    metrics["es/too_long"] = float(sum(g[4] for g in gathered.values()))
    metrics.update(generated_tokens(gathered))
    metrics.update({"samples/generated": float(state.iteration * rewards_N_P.numel()),
                    "perf/iter_s": time.perf_counter() - t0})
    ledger = {"iteration": state.iteration - 1, "run_seed": cfg.seed,
              "algorithm": cfg.es.algorithm, "prompt_ids": [p.id for p in batch],
              "rewards_N": rewards_N_P.mean(dim=1).tolist(),
              "rewards_N_P": rewards_N_P.tolist(),
              # What the search was told, exactly (float32): the replay of a resume.
              "fitness_N": fitness_N.tolist()}
    return state, metrics, ledger


def _moved(state: SearchState, rewards_N_P: torch.Tensor, edges: Edges) -> dict[str, float]:
    """Adopt the search's new centre (served from now on) and measure the move."""
    before = flatten(state.params)
    after = search_center(state.search)
    fitness_N = rewards_N_P.mean(dim=1)
    update = float((after.double() - before.double()).norm())
    metrics = {"es/reward_mean": float(fitness_N.mean()),
               "es/reward_std": float(fitness_N.std(correction=0)),
               "es/reward_min": float(fitness_N.min()), "es/reward_max": float(fitness_N.max()),
               "es/update_norm": update, "es/param_norm": float(after.double().norm())}
    stdev = state.search.status.get("stdev") if "stdev" in state.search.status else None
    if stdev is not None:
        metrics["es/search_stdev"] = float(torch.as_tensor(stdev).double().mean())
    check("update", "es/update_norm", update, True, metrics)
    state.params = unflatten(after, state.layout)
    state.iteration += 1
    edges.weights.set_master(state.params)
    return metrics


def replay(cfg: ESRunConfig, state: SearchState, entries: list[dict]) -> SearchState:
    """The search after ``entries``: each generation sampled again from the same generator
    and told its recorded fitnesses, so its distribution comes back bitwise."""
    for entry in entries:
        if entry.get("algorithm") != cfg.es.algorithm:
            raise BadInput(f"ledger entry {entry.get('iteration')} was written by "
                           f"es.algorithm={entry.get('algorithm', 'es')!r}, not "
                           f"{cfg.es.algorithm!r}; resume a run with the algorithm it ran.")
        fitness_N = torch.tensor(entry["fitness_N"], dtype=torch.float32)
        state.fitness.evaluate = lambda values_N_D, f=fitness_N: f
        state.search.step()
        state.fitness.evaluate = None
        state.params = unflatten(search_center(state.search), state.layout)
        state.iteration += 1
    return state


# evotorch's algorithms as the run's search.
EVOTORCH = Search(init, step, replay)
