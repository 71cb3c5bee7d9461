"""The ES loop: every rank evaluates its share of the population on the iteration's prompts,
only rewards cross the wire, and every rank applies the identical update itself.

``step`` is one iteration; ``run`` is the whole job. The model-free maths (keyed noise,
shaping, the estimate, the optimizer) live in ``populations``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from es_llm.adapters import save_adapter
from es_llm.backends.base import SamplingParams
from es_llm.config import run_config_yaml
from es_llm.errors import BadInput, NonFinite
from es_llm.es.config import ESRunConfig
from es_llm.es.weights import AdapterWeights, ModuleWeights
from es_llm.finite import Diverged, check, check_start, stop_error
from es_llm.io import complete_jsonl_rows, save_hf_checkpoint, write_text_atomic
from es_llm.run_folder import AppendLog, written
from es_llm.tasks import Problem
from es_llm.tasks.base import too_long_notice
from populations import es as pes
from populations import lowrank
from populations.noise import draw_direction


@dataclass
class Edges:
    """What the loop is handed: the communicator, the model, its weights and its sampler."""

    comm: object
    model: torch.nn.Module
    tokenizer: object
    weights: ModuleWeights | AdapterWeights
    backend: object
    task: object
    # Per-row low-rank member terms (engine.serve=rows); None writes each member's weights.
    rows: object = None


def prompt_batch(problems: list[Problem], cfg: ESRunConfig, iteration: int) -> list[Problem]:
    """The iteration's prompts: a seeded sample without replacement, the same on every rank."""
    rng = random.Random(f"{cfg.seed}:batch:{iteration}")
    k = min(cfg.prompts_per_iteration, len(problems))
    return rng.sample(problems, k)


def owned_members(members, rank: int, size: int) -> list:
    """The members rank ``rank`` evaluates: whole noise directions (direction d goes to rank
    d % size), so both halves of a mirrored pair land on one rank and share one noise draw."""
    return [m for m in members if m.direction % size == rank]


def member_prompts(members, n_batch: int, per_member: int) -> list[list[int]]:
    """Batch indices each member is scored on, in member order.

    ``per_member == 0``: every member on the whole batch. Otherwise direction d (both members
    of a mirrored pair) gets the ``per_member`` consecutive indices from ``d * per_member``,
    wrapping around the batch: pairs are spread evenly, each prompt shared by about
    ``directions * per_member / n_batch`` pairs (EGGROLL scores 4 pairs per prompt). The
    batch itself is the iteration's seeded sample, so which problems a pair sees changes
    from one iteration to the next.
    """
    if per_member == 0:
        return [list(range(n_batch)) for _ in members]
    return [[(m.direction * per_member + i) % n_batch for i in range(per_member)]
            for m in members]


def _weight_written(edges: Edges, state: pes.ESState, mine, batch, assigned, params,
                    cfg: ESRunConfig):
    """``(member, problems, completions)`` for each member, its weights written into the served
    model as cast(master + sign * sigma * eps) over the previous member's (one write per
    member, one restore at the end). A direction's noise is drawn once for both signs, on
    every core this process may use (the cores are idle between generate calls)."""
    eps_for = pes.noise_for(cfg.es, state)
    threads = len(os.sched_getaffinity(0)) if cfg.es.noise_device == "cpu" else 1
    try:
        for direction, group in itertools.groupby(mine, key=lambda m: m.direction):
            eps = draw_direction(eps_for, direction, edges.weights.shapes(), threads)
            for m in group:
                edges.weights.perturb(lambda name, _shape: eps[name], m.sign, cfg.es.sigma)
                problems = [batch[i] for i in assigned[m.index]]
                completions = edges.backend.generate([p.prompt for p in problems], params,
                                                     keys=[p.id for p in problems])
                yield m, problems, [c[0] for c in completions]
    finally:
        edges.weights.restore()


def _lowrank_terms(edges: Edges, state: pes.ESState, cfg: ESRunConfig):
    """``chunk -> (A, B)``: the ``RowAdapters`` terms of EGGROLL members (``es.kind=lowrank``),
    A (M, out, r) = sign sigma / sqrt(r) times the keyed factor, B (M, in, r)."""
    factors_for = lowrank.keyed_factors(state.seed, state.iteration, cfg.es.rank,
                                        device=cfg.es.noise_device)
    scale = cfg.es.sigma / math.sqrt(cfg.es.rank)
    served = edges.weights.params

    def terms(chunk):
        # A mirrored pair shares its direction's draw; members index the chunk's directions,
        # and one product scales them all (one product per member cost about 3% of a call
        # on the habits model, this about half that). Each A is rounded as sign * scale
        # times the draw in fp32, as a per-member product rounds it.
        directions = list(dict.fromkeys(m.direction for m in chunk))
        at = {d: i for i, d in enumerate(directions)}
        index_M = torch.tensor([at[m.direction] for m in chunk])
        coef_M = torch.tensor([m.sign * scale for m in chunk], dtype=torch.float32)
        A, B = {}, {}
        for name in edges.rows.matrices:
            p = served[name]
            drawn = [factors_for(d, name, p.shape) for d in directions]
            A_D = torch.stack([a for a, _ in drawn])
            B_D = torch.stack([b for _, b in drawn])
            A[name] = (A_D[index_M] * coef_M[:, None, None]).to(p.device, p.dtype)
            B[name] = B_D[index_M].to(p.device, p.dtype)
        return A, B
    return terms


def _adapter_terms(edges: Edges, state: pes.ESState, cfg: ESRunConfig):
    """``chunk -> (A, B)``: the ``RowAdapters`` terms of adapter members (``lora.enabled``),
    each member's whole adapter ``scale B' A'`` over the base weights (``AdapterWeights.
    row_terms``); a direction's noise is drawn once for both signs."""
    eps_for = pes.noise_for(cfg.es, state)

    def terms(chunk):
        members = []
        for direction, group in itertools.groupby(chunk, key=lambda m: m.direction):
            eps = {n: eps_for(direction, n, shape) for n, shape in edges.weights.shapes().items()}
            members += [edges.weights.member_factors(lambda n, _shape: eps[n], m.sign,
                                                     cfg.es.sigma) for m in group]
        return edges.weights.row_terms(members)
    return terms


def _row_served(edges: Edges, state: pes.ESState, mine, batch, assigned, params,
                cfg: ESRunConfig):
    """``(member, problems, completions)`` for each member, ``engine.members_per_call``
    members per generate call, each row adding its member's low-rank term (``RowAdapters``);
    factors are drawn per call, so memory is bounded by the call, not the population.
    Adapter members are added to the base weights, which the target layers serve
    meanwhile."""
    adapter = cfg.lora.enabled
    terms = (_adapter_terms if adapter else _lowrank_terms)(edges, state, cfg)
    per_call = cfg.engine.members_per_call
    if adapter:
        edges.weights.serve_base()
    try:
        yield from _row_calls(edges, mine, batch, assigned, params, per_call, terms)
    finally:
        if adapter:
            edges.weights.restore()


def _row_calls(edges: Edges, mine, batch, assigned, params, per_call: int, terms):
    """The generate calls of ``_row_served``: ``per_call`` members each, terms from ``terms``."""
    for start in range(0, len(mine), per_call):
        chunk = mine[start:start + per_call]
        A, B = terms(chunk)
        problems = [[batch[i] for i in assigned[m.index]] for m in chunk]
        rows = [p for ps in problems for p in ps]
        with edges.rows.members(A, B, len(problems[0])):
            completions = edges.backend.generate([p.prompt for p in rows], params,
                                                 keys=[p.id for p in rows])
        at = 0
        for m, ps in zip(chunk, problems):
            yield m, ps, [c[0] for c in completions[at:at + len(ps)]]
            at += len(ps)


def member_sampling(cfg: ESRunConfig) -> SamplingParams:
    """How every member generates: greedy, one completion of at most ``max_tokens``."""
    return SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)


def score_served(edges: Edges, served) -> dict[int, tuple]:
    """Score what ``served`` yields, ``(member, problems, completions)`` per member:
    ``{index: (rewards per prompt, correct count, well-formed count, digest of its texts,
    count of texts too long to score, generated tokens)}``. The digest lets rank 0 tell
    whether a mirrored pair generated identical texts without sending them."""
    out = {}
    for m, problems, completions in served:
        texts = [c.text for c in completions]
        scores = edges.task.score_many(list(zip(problems, texts)))
        digest = hashlib.blake2b("\x1f".join(texts).encode(), digest_size=8).hexdigest()
        out[m.index] = ([s.reward for s in scores], sum(s.correct for s in scores),
                        sum(s.format_ok for s in scores), digest,
                        sum(s.too_long for s in scores),
                        sum(len(c.token_ids) for c in completions))
    return out


def generated_tokens(gathered: dict[int, tuple]) -> dict[str, float]:
    """The tokens every member generated this iteration (EOS included where one ended a
    completion): the token side of the budget, beside samples/generated."""
    return {"tokens/iteration": float(sum(g[5] for g in gathered.values()))}


def evaluate_members(edges: Edges, state: pes.ESState, members, batch: list[Problem],
                     cfg: ESRunConfig) -> dict[int, tuple]:
    """What each member this rank owns (``owned_members``) scored (see ``score_served``)."""
    assigned = member_prompts(members, len(batch), cfg.engine.prompts_per_member)
    mine = owned_members(members, edges.comm.rank, edges.comm.size)
    serve = _row_served if edges.rows is not None else _weight_written
    return score_served(edges, serve(edges, state, mine, batch, assigned, member_sampling(cfg),
                                     cfg))


def gather(comm, mine: dict) -> dict:
    """Every rank's ``{member index: scores}`` merged: the only exchange of an iteration."""
    gathered: dict[int, tuple] = {}
    for part in comm.allgather(mine):
        gathered.update(part)
    return gathered


def pair_diagnostics(members, gathered: dict[int, tuple]) -> dict[str, float]:
    """Why an iteration does or does not move (antithetic runs): the share of mirrored
    pairs whose fitness differs, whose greedy texts are identical on every prompt, whose
    correct counts differ, and whose well-formed counts differ."""
    pairs = [(a, b) for a, b in zip(members[0::2], members[1::2]) if a.direction == b.direction]
    if not pairs or len(pairs) * 2 != len(members):
        return {}
    n = len(pairs)
    ga = [(gathered[a.index], gathered[b.index]) for a, b in pairs]
    return {"es/pairs_reward_differs": sum(sum(x[0]) != sum(y[0]) for x, y in ga) / n,
            "es/pairs_same_text": sum(x[3] == y[3] for x, y in ga) / n,
            "es/pairs_correct_differs": sum(x[1] != y[1] for x, y in ga) / n,
            "es/pairs_format_differs": sum(x[2] != y[2] for x, y in ga) / n}


def step(edges: Edges, state: pes.ESState, problems: list[Problem], cfg: ESRunConfig):
    """One ES iteration; returns the new state, the metrics and the ledger entry."""
    t0 = time.perf_counter()
    iteration = state.iteration
    members = pes.ask(cfg.es, state)
    batch = prompt_batch(problems, cfg, iteration)
    try:
        mine = evaluate_members(edges, state, members, batch, cfg)
    except NonFinite:
        raise Diverged("next-token logits", "es/logits", math.nan, iteration > 0) from None
    t_eval = time.perf_counter() - t0
    gathered = gather(edges.comm, mine)
    rewards_N_P = torch.tensor([gathered[n][0] for n in range(len(members))],
                               dtype=torch.float64)
    assigned = member_prompts(members, len(batch), cfg.engine.prompts_per_member)
    groups_N_P = torch.tensor(assigned) if cfg.engine.prompts_per_member else None
    before = state.params
    check("reward", "es/reward_mean", float(rewards_N_P.sum()), iteration > 0)
    state, es_metrics = pes.tell(cfg.es, state, rewards_N_P, groups_N_P)
    metrics = {f"es/{k}": v for k, v in es_metrics.items()}
    check_es_update(metrics, state, cfg.runtime.dtype, iteration > 0)
    edges.weights.set_master(state.params)
    # An adapter's factors are never served in the model's dtype (only merged weights are),
    # so the realised-update cosine of the master has no meaning there.
    if cfg.runtime.dtype != "float32" and not cfg.lora.enabled:
        metrics["es/realised_cosine"] = pes.realised_cosine(before, state.params,
                                                            cfg.runtime.torch_dtype())
    metrics.update(pair_diagnostics(members, gathered))
    metrics["es/too_long"] = float(sum(g[4] for g in gathered.values()))
    metrics.update(generated_tokens(gathered))
    # Greedy rollouts generated so far (every member on each of its prompts): the budget
    # axis the comparison report shares with the gradient trainers' samples/generated.
    samples = (iteration + 1) * rewards_N_P.numel()
    metrics.update({"samples/generated": float(samples), "perf/iter_s": time.perf_counter() - t0,
                    "perf/eval_s": t_eval})
    ledger = {"iteration": iteration, "run_seed": state.seed,
              "members": [[m.direction, m.sign] for m in members],
              "prompt_ids": [p.id for p in batch],
              "rewards_N": rewards_N_P.mean(dim=1).tolist(),
              # Per-prompt rewards: what `tell` saw, so a replay (resume) is exact for every
              # shaping, including per-prompt group z-scores.
              "rewards_N_P": rewards_N_P.tolist()}
    if groups_N_P is not None:
        # Which batch index each reward belongs to (the groups of group_zscore).
        ledger["prompts_N_P"] = assigned
    return state, metrics, ledger


def check_es_update(metrics: dict, state: pes.ESState, dtype: str, moved: bool) -> None:
    """Raise ``Diverged`` when the estimate or the new weights are not finite, or (float16)
    do not fit the served dtype: a cast beyond its range would serve inf."""
    check("gradient estimate", "es/grad_norm", metrics["es/grad_norm"], moved, metrics)
    check("update", "es/update_norm", metrics["es/update_norm"], True, metrics)
    if dtype == "float16":
        largest = max(float(t.abs().max()) for t in state.params.values())
        if largest > torch.finfo(torch.float16).max:
            raise Diverged("update (served in float16)", "es/largest_weight", math.inf, True,
                           metrics)


def probe_sigma(edges: Edges, cfg: ESRunConfig, problems: list[Problem],
                sigmas: list[float]) -> list[dict]:
    """Before a run: iteration 0's population and prompts evaluated at each candidate sigma
    (no update). Per sigma, the pair diagnostics of ``pair_diagnostics``: at a sigma where
    almost no mirrored pair differs in correctness the estimate is mostly zero, and where
    most pairs write different texts on every prompt the search is no longer local."""
    rows = []
    for sigma in sigmas:
        at = dataclasses.replace(cfg, es=dataclasses.replace(cfg.es, sigma=sigma))
        state = pes.init(at.es, edges.weights.master, at.seed)
        members = pes.ask(at.es, state)
        batch = prompt_batch(problems, at, 0)
        gathered = gather(edges.comm, evaluate_members(edges, state, members, batch, at))
        fitness = [sum(gathered[n][0]) / len(gathered[n][0]) for n in range(len(members))]
        rows.append({"sigma": sigma, "reward_mean": sum(fitness) / len(fitness),
                     **{k.removeprefix("es/"): v
                        for k, v in pair_diagnostics(members, gathered).items()}})
    return rows


def save_checkpoint(edges: Edges, cfg: ESRunConfig, folder: Path, resume: str) -> None:
    """An HF folder of the current (unperturbed) weights (see ``save_hf_checkpoint``); with
    ``lora.enabled`` these are the adapter merged into the base, and ``adapter/`` holds the
    adapter itself in PEFT's format (its base: ``cfg.model``)."""
    def adapter(tmp: Path) -> None:
        save_adapter(tmp / "adapter", edges.weights.master, cfg.lora, cfg.model)

    with written(folder, resume):
        save_hf_checkpoint(edges.model, edges.tokenizer, folder, data_from=cfg.model,
                           extra=adapter if cfg.lora.enabled else None)


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
        groups = entry.get("prompts_N_P")
        state, _ = pes.tell(es_cfg, state, rewards_N_P,
                            None if groups is None else torch.tensor(groups))
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


@dataclass(frozen=True)
class Search:
    """How a run's weights move, as three functions over a state that has ``iteration``
    and ``params`` (the fp32 tensors the served weights are set to): its start, one
    iteration (``(state, metrics, ledger entry)``) and the replay of a ledger."""

    init: Callable[[ESRunConfig, Edges], object]
    step: Callable[[Edges, object, list[Problem], ESRunConfig], tuple]
    replay: Callable[[ESRunConfig, object, list[dict]], object]


def _own_init(cfg: ESRunConfig, edges: Edges) -> pes.ESState:
    return pes.init(cfg.es, edges.weights.master, cfg.seed)


def _own_replay(cfg: ESRunConfig, state: pes.ESState, entries: list[dict]) -> pes.ESState:
    return replay(cfg.es, state, entries)


# es-llm's own ES (es.algorithm=es): keyed noise, only seeds and rewards on the wire.
OWN_ES = Search(_own_init, step, _own_replay)


def run(cfg: ESRunConfig, edges: Edges, problems: list[Problem], out: Path,
        progress: bool = True, resume: bool = False, search: Search = OWN_ES):
    """Run ``search`` up to ``cfg.iterations``; rank 0 writes the run folder. With
    ``resume`` the ledger in ``out`` is replayed first and the run continues after its last
    iteration."""
    lead = edges.comm.rank == 0
    check_start(edges.weights.master.items(), cfg.model)
    state = search.init(cfg, edges)
    if resume:
        state = search.replay(cfg, state, read_ledger(out))
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
    said_too_long = False
    for it in bar:
        try:
            state, metrics, ledger = search.step(edges, state, problems, cfg)
        except Diverged as exc:
            # Every rank computes the same update, so every rank stops here together; the
            # ledger ends at the last finite iteration, which --resume rebuilds.
            if lead:
                metrics_f.write_row(exc.row(step=it))
            edges.comm.barrier()
            raise stop_error(exc, "iteration", it, f"Lower es.lr (now {cfg.es.lr:g})",
                             out) from None
        if (it + 1) % cfg.checksum_every == 0 or it + 1 == cfg.iterations:
            check_ranks_agree(edges, it)
        if lead:
            metrics_f.write_row({"step": it, **metrics})
            ledger_f.write(json.dumps(ledger) + "\n")
            bar.write(f"iter {it:4d}  reward {metrics['es/reward_mean']:.4f} "
                      f"(max {metrics['es/reward_max']:.4f})  update {metrics['es/update_norm']:.3e}"
                      f"  {metrics['perf/iter_s']:.1f} s")
            if metrics["es/too_long"] and not said_too_long:
                said_too_long = True
                bar.write(too_long_notice(int(metrics["es/too_long"]),
                                          cfg.task.max_completion_chars, f"of iteration {it}",
                                          "es/too_long"))
            if (it + 1) % cfg.checkpoint_every == 0 and it + 1 < cfg.iterations:
                save_checkpoint(edges, cfg, out / "checkpoints" / f"step_{it + 1}", again)
    if lead:
        save_checkpoint(edges, cfg, out / "checkpoints" / "final", again)
        metrics_f.close()
        ledger_f.close()
    edges.comm.barrier()
    return state
