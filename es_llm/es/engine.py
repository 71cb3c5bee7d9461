"""The ES loop: every rank evaluates its share of the population on the same prompts,
only rewards cross the wire, and every rank applies the identical update itself.

``step`` is one iteration; ``run`` is the whole job. The model-free maths (keyed noise,
shaping, the estimate, the optimizer) live in ``populations``.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from es_llm.backends.base import SamplingParams
from es_llm.config import run_config_yaml
from es_llm.errors import BadInput
from es_llm.es.config import ESRunConfig
from es_llm.es.weights import ModuleWeights
from es_llm.io import complete_jsonl_rows, save_hf_checkpoint, write_text_atomic
from es_llm.run_folder import AppendLog, written
from es_llm.tasks import Problem
from populations import es as pes
from populations.optimizers import OptimizerConfig


@dataclass
class Edges:
    """What the loop is handed: the communicator, the model, its weights and its sampler."""

    comm: object
    model: torch.nn.Module
    tokenizer: object
    weights: ModuleWeights
    backend: object
    task: object


def prompt_batch(problems: list[Problem], cfg: ESRunConfig, iteration: int) -> list[Problem]:
    """The iteration's prompts: a seeded sample without replacement, the same on every rank."""
    rng = random.Random(f"{cfg.seed}:batch:{iteration}")
    k = min(cfg.prompts_per_iteration, len(problems))
    return rng.sample(problems, k)


def es_config(cfg: ESRunConfig) -> pes.ESConfig:
    """The model-free ES settings of a run."""
    e = cfg.es
    return pes.ESConfig(population=e.population, sigma=e.sigma, antithetic=e.antithetic,
                        shaping=e.shaping, run_seed=cfg.seed, noise_device=e.noise_device,
                        optimizer=OptimizerConfig(name=e.optimizer, lr=e.lr,
                                                  anchor_decay=e.anchor_decay))


def owned_members(members, rank: int, size: int) -> list:
    """The members rank ``rank`` evaluates: whole noise directions (direction d goes to rank
    d % size), so both halves of a mirrored pair land on one rank and share one noise draw."""
    return [m for m in members if m.direction % size == rank]


def evaluate_members(edges: Edges, es_cfg: pes.ESConfig, state: pes.ESState, members,
                     batch: list[Problem], cfg: ESRunConfig) -> dict[int, list[float]]:
    """Rewards per prompt for the members this rank owns (``owned_members``).

    A member's weights are written as cast(master + sign * sigma * eps) straight over the
    previous member's, so the served model is written once per member and restored once at
    the end. The noise of a direction is drawn once and kept for its mirrored member (one
    extra fp32 copy of the evolving weights while the pair is evaluated).
    """
    params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)
    prompts = [p.prompt for p in batch]
    eps_for = pes.noise_for(es_cfg, state)
    mine = owned_members(members, edges.comm.rank, edges.comm.size)
    out = {}
    try:
        for direction, group in itertools.groupby(mine, key=lambda m: m.direction):
            cache: dict[str, torch.Tensor] = {}

            def noise(name, shape, d=direction, cache=cache):
                if name not in cache:
                    cache[name] = eps_for(d, name, shape)
                return cache[name]

            for m in group:
                edges.weights.perturb(noise, m.sign * cfg.es.sigma)
                completions = edges.backend.generate(prompts, params,
                                                     keys=[p.id for p in batch])
                scores = edges.task.score_many([(p, c[0].text)
                                                for p, c in zip(batch, completions)])
                out[m.index] = [s.reward for s in scores]
    finally:
        edges.weights.restore()
    return out


def step(edges: Edges, es_cfg: pes.ESConfig, state: pes.ESState, problems: list[Problem],
         cfg: ESRunConfig):
    """One ES iteration; returns the new state, the metrics and the ledger entry."""
    t0 = time.perf_counter()
    iteration = state.iteration
    members = pes.ask(es_cfg, state)
    batch = prompt_batch(problems, cfg, iteration)
    mine = evaluate_members(edges, es_cfg, state, members, batch, cfg)
    t_eval = time.perf_counter() - t0
    # The only communication of an iteration: each rank's {member: rewards per prompt}.
    gathered: dict[int, list[float]] = {}
    for part in edges.comm.allgather(mine):
        gathered.update(part)
    rewards_N_P = torch.tensor([gathered[n] for n in range(len(members))], dtype=torch.float64)
    state, es_metrics = pes.tell(es_cfg, state, rewards_N_P)
    edges.weights.set_master(state.params)
    metrics = {f"es/{k}": v for k, v in es_metrics.items()}
    # Greedy rollouts generated so far (every member on every prompt): the budget axis the
    # comparison report shares with the gradient trainers' samples/generated.
    samples = (iteration + 1) * len(members) * len(batch)
    metrics.update({"samples/generated": float(samples), "perf/iter_s": time.perf_counter() - t0,
                    "perf/eval_s": t_eval})
    ledger = {"iteration": iteration, "run_seed": cfg.seed,
              "members": [[m.direction, m.sign] for m in members],
              "prompt_ids": [p.id for p in batch],
              "rewards_N": rewards_N_P.mean(dim=1).tolist(),
              # Per-prompt rewards: what `tell` saw, so a replay (resume) is exact for every
              # shaping, including per-prompt group z-scores.
              "rewards_N_P": rewards_N_P.tolist()}
    return state, metrics, ledger


def save_checkpoint(edges: Edges, cfg: ESRunConfig, folder: Path, resume: str) -> None:
    """An HF folder of the current (unperturbed) weights (see ``save_hf_checkpoint``)."""
    with written(folder, resume):
        save_hf_checkpoint(edges.model, edges.tokenizer, folder, data_from=cfg.model)


def check_ranks_agree(edges: Edges, iteration: int) -> None:
    """Seeds-only ES relies on every rank computing the same update; verify it."""
    sums = edges.comm.allgather(edges.weights.checksum())
    if len(set(sums)) > 1:
        bad = [r for r, s in enumerate(sums) if s != sums[0]]
        edges.comm.abort(f"ES ranks diverged at iteration {iteration}: weight checksums differ "
                         f"between rank 0 and rank(s) {bad}; the run cannot continue.")


def read_ledger(out: Path) -> list[dict]:
    """The complete entries of a run's ledger, in order; a line cut short by a killed
    process is dropped (it is the iteration that did not finish)."""
    entries = []
    path = out / "ledger.jsonl"
    if not path.is_file():
        return entries
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break
        if entry.get("iteration") != len(entries):
            raise BadInput(f"{path} is not a consistent ES ledger: entry {len(entries)} has "
                           f"iteration {entry.get('iteration')!r}.")
        entries.append(entry)
    return entries


def replay(es_cfg: pes.ESConfig, state: pes.ESState, entries: list[dict]) -> pes.ESState:
    """Rebuild the state after ``entries`` from the base state: the same keyed noise and the
    same rewards make ``tell`` give bitwise the same weights (and optimizer state)."""
    for entry in entries:
        rewards_N_P = torch.tensor(entry["rewards_N_P"], dtype=torch.float64)
        state, _ = pes.tell(es_cfg, state, rewards_N_P)
    return state


def _open_logs(out: Path, start: int, resume: str):
    """Open metrics and ledger for appending after iteration ``start``, first rewriting
    both (atomically) without anything a killed run left beyond it."""
    metrics = [m for m in complete_jsonl_rows(out / "metrics.jsonl") if m.get("step", start) < start]
    ledger = complete_jsonl_rows(out / "ledger.jsonl")[:start]
    for name, rows in (("metrics.jsonl", metrics), ("ledger.jsonl", ledger)):
        with written(out / name, resume):
            write_text_atomic(out / name, "".join(json.dumps(r) + "\n" for r in rows))
    return AppendLog(out / "metrics.jsonl", resume), AppendLog(out / "ledger.jsonl", resume)


def run(cfg: ESRunConfig, edges: Edges, problems: list[Problem], out: Path,
        progress: bool = True, resume: bool = False):
    """Run ES up to ``cfg.iterations``; rank 0 writes the run folder. With ``resume`` the
    ledger in ``out`` is replayed first and the run continues after its last iteration."""
    lead = edges.comm.rank == 0
    es_cfg = es_config(cfg)
    state = pes.init(es_cfg, edges.weights.master)
    if resume:
        state = replay(es_cfg, state, read_ledger(out))
        edges.weights.set_master(state.params)
    edges.comm.barrier()  # every rank has read the ledger before rank 0 rewrites it
    again = f"es-llm es --resume {out}"
    if lead:
        out.mkdir(parents=True, exist_ok=True)
        with written(out / "config.yaml", again):
            write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
        metrics_f, ledger_f = _open_logs(out, state.iteration, again)
    bar = tqdm(range(state.iteration, cfg.iterations), desc="es", unit="iter",
               disable=not (progress and lead), initial=state.iteration, total=cfg.iterations)
    for it in bar:
        state, metrics, ledger = step(edges, es_cfg, state, problems, cfg)
        if (it + 1) % cfg.checksum_every == 0 or it + 1 == cfg.iterations:
            check_ranks_agree(edges, it)
        if lead:
            metrics_f.write(json.dumps({"step": it, **metrics}) + "\n")
            ledger_f.write(json.dumps(ledger) + "\n")
            bar.write(f"iter {it:4d}  reward {metrics['es/reward_mean']:.4f} "
                      f"(max {metrics['es/reward_max']:.4f})  update {metrics['es/update_norm']:.3e}"
                      f"  {metrics['perf/iter_s']:.1f} s")
            if (it + 1) % cfg.checkpoint_every == 0 and it + 1 < cfg.iterations:
                save_checkpoint(edges, cfg, out / "checkpoints" / f"step_{it + 1}", again)
    if lead:
        save_checkpoint(edges, cfg, out / "checkpoints" / "final", again)
        metrics_f.close()
        ledger_f.close()
    edges.comm.barrier()
    return state
