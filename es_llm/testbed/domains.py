"""Domain models: the student's architecture pretrained on another task domain.

A domain section of the testbed config (``code``: the pyfunc task, ``chess``: the chess task,
``reasoning``: Countdown in several roles, ``es_llm.tasks.countdown_roles``) builds a causal LM of the student's family and tokenizer on that task's generated problems
and worked solutions, with held-out ``eval`` and ``rl`` sets that training never sees. It is
what ES and the gradient methods post-train on the second and third domains, so it uses the
student's pretraining loop (``train.train``) with the domain's example stream.

Like everything the build trains, the result is a pure function of the config: held-out sets
and training examples come from ``random.Random`` streams seeded by the config's seed and the
domain's name.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import random
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from es_llm.io import write_jsonl_atomic
from es_llm.testbed.config import EXAMPLE_MODULES, MODEL_TASKS, DomainLM, TestbedConfig
from es_llm.testbed.train import _distinct, _problem_key, _renumber, make_model, record, train

_CHUNK = 500


def _examples(name: str):
    """The module that makes a section's examples: it provides ``generate(rng, tier) ->
    (Problem, completion)``, its ``TIERS`` and optionally ``held_out`` (the same for the
    held-out problems; ``generate`` when it has none)."""
    return importlib.import_module(EXAMPLE_MODULES[name])


def _generator(name: str) -> Callable:
    return _examples(name).generate


def _tiers(name: str, domain: DomainLM) -> tuple[int, ...]:
    return domain.tiers or _examples(name).TIERS


def roles_of(name: str) -> tuple[str, ...]:
    """The roles a section's model learns (``ROLES`` of its example module; none for a
    one-role domain)."""
    return tuple(getattr(_examples(name), "ROLES", ()))


def held_out(name: str, cfg: TestbedConfig) -> tuple[dict[str, list], set]:
    """The domain's eval and rl sets (disjoint), and the keys training must avoid."""
    task, domain = MODEL_TASKS[name], getattr(cfg, name)
    module = _examples(name)
    generate = getattr(module, "held_out", module.generate)
    rng, seen, sets = random.Random(f"{cfg.seed}:{name}:held-out"), set(), {}
    for split, per_tier in (("eval", domain.eval_per_tier), ("rl", domain.rl_per_tier)):
        problems = []
        for tier in _tiers(name, domain):
            problems += _distinct(lambda: generate(rng, tier), per_tier, seen,
                                  f"{task} tier-{tier}")
        sets[f"{task}_{split}"] = _renumber(problems, f"{task}-{split}")
    return sets, seen


def example_stream(name: str, cfg: TestbedConfig, excluded: set,
                   progress: bool) -> Callable[[random.Random], tuple[str, str]]:
    """``draw(rng)``: one (prompt, completion) training example of the domain, never a
    held-out problem; from a pre-drawn pool when ``pool_per_tier`` is set."""
    domain = getattr(cfg, name)
    generate, tiers = _generator(name), _tiers(name, domain)
    weights = domain.weights or (1.0,) * len(tiers)

    if not domain.pool_per_tier:
        return lambda rng: _kept_example(
            generate, rng, lambda: rng.choices(tiers, weights=weights)[0], excluded)
    pools = _draw_pools(name, tiers, domain.pool_per_tier, cfg.seed, excluded, progress)
    return lambda rng: rng.choice(rng.choices(pools, weights=weights)[0])


def _pool_chunk(name: str, tier: int, seed: str, count: int,
                excluded: frozenset) -> list[tuple[str, str]]:
    """``count`` training examples of one tier from their own seeded stream (one chunk of a
    pool, so the pool is the same however many processes draw it)."""
    generate, rng = _generator(name), random.Random(seed)
    return [_kept_example(generate, rng, lambda: tier, excluded) for _ in range(count)]


def _kept_example(generate: Callable, rng: random.Random, draw_tier: Callable[[], int],
                  excluded) -> tuple[str, str]:
    """The first generated (prompt, completion) whose problem is not held out; the tier is
    drawn afresh for every try."""
    while True:
        problem, completion = generate(rng, draw_tier())
        if _problem_key(problem) not in excluded:
            return problem.prompt, completion


def _draw_pools(name: str, tiers: tuple[int, ...], per_tier: int, seed: int,
                excluded: set, progress: bool) -> list[list[tuple[str, str]]]:
    """One pool of ``per_tier`` examples per tier, drawn in chunks of 500 by one process per
    core (slow generators such as chess's search are the reason pools exist)."""
    jobs = [(tier, start) for tier in tiers for start in range(0, per_tier, _CHUNK)]
    frozen = frozenset(excluded)
    bar = tqdm(total=per_tier * len(tiers), desc=f"{name} examples", disable=not progress)
    # Fork, as torch's data loaders do: the workers run only the task's generator, and
    # scripts calling the build need no main-module guard.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1),
                             mp_context=context) as pool:
        futures = {job: pool.submit(_pool_chunk, name, job[0], f"{seed}:{name}:pool:{job[0]}:"
                                    f"{job[1]}", min(_CHUNK, per_tier - job[1]), frozen)
                   for job in jobs}
        for future in as_completed(futures.values()):
            bar.update(len(future.result()))
        chunks = {job: future.result() for job, future in futures.items()}
    bar.close()
    return [[ex for (tier, _), chunk in chunks.items() if tier == t for ex in chunk]
            for t in tiers]


def build_domain(name: str, cfg: TestbedConfig, tokenizer, folder: Path,
                 progress: bool) -> tuple[object, dict]:
    """Write the domain's held-out sets under ``folder/data`` and pretrain its model."""
    sets, excluded = held_out(name, cfg)
    for split, problems in sets.items():
        write_jsonl_atomic(folder / "data" / f"{split}.jsonl", [record(p) for p in problems])
    domain = getattr(cfg, name)
    sub = replace(cfg, model=domain.model, train=domain.train)
    model = make_model(sub, tokenizer)
    draw = example_stream(name, cfg, excluded, progress)
    stats = train(model, tokenizer, sub, excluded, progress, draw=draw)
    stats["held_out"] = {k: len(v) for k, v in sets.items()}
    return model, stats
