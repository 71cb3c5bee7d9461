"""The GRPO-family training loop: generate -> score -> advantages -> loss -> optimizer step.

``step`` is one step, ``run`` the whole job. Every method difference is a registered function
picked by name from the config (advantages, policy loss, aggregation, KL estimator) or a
switch on the data side (dynamic sampling, overlong shaping, prefixes, replay); the loop
itself has no per-method branches.

Log-prob bookkeeping (the usual source of silent GRPO bugs):
* ``engine_logp``: what the sampler reported for the sampled tokens (vLLM's processed
  log-probs, or the HF loop's), at the rollout temperature;
* ``old_logp``: the trainer's own log-probs before any update of this step, computed once
  when a ratio can differ from 1 (several epochs or mini-batches, replay) or when the
  trainer/engine mismatch is corrected; otherwise old = sg(current), so the ratio is 1 and
  the gradient is the policy gradient;
* the mismatch weight ``is_weight`` = f(old_logp - engine_logp) (TIS/MIS), frozen at birth
  like ``old_logp`` for replayed rollouts.

Every log-prob goes through the registered estimator of ``algo.dllm.estimator``
(``gradient.dllm.estimators``): exact teacher forcing for causal LMs, a masked estimate for
diffusion LMs, whose sampler reports none (so ``engine_logp`` is None and there is no
mismatch correction). An estimator whose masks change per inner iteration (d1) has its
old and reference log-probs frozen once per iteration (``old_views``, ``ref_views``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from es_llm.config import run_config_yaml
from es_llm.io import complete_jsonl_rows, save_hf_checkpoint, write_text_atomic
from es_llm.run_folder import AppendLog, written
from gradient.advantages import AdvantageInput, compute_advantages
from gradient.aggregation import aggregate
from gradient.config import GRPORunConfig
from gradient.distill.birth import distill_rows
from gradient.distill.drift_gate import drift_gates
from gradient.distill.methods import method_spec
from gradient.distill.opd import generalized_jsd
from gradient.distill.scoring import divergence_params, target_logp
from gradient.dllm.estimators import (EstimateInput, estimate, estimator_spec,
                                      quadrature_levels, scored_tokens, teacher_view_targets)
from gradient.kl import kl_estimate
from gradient.logprobs import pad_rows
from gradient.losses import LossInput, compute_loss, gapo_clip_high
from gradient.rollout_correction import is_weights
from gradient.rollouts import collect, prefix_controller_config
from gradient.seeds import derive_seed


@dataclass
class Edges:
    """What the loop is handed: the policy and its optimizer, the sampler and its weight
    sync, the task, and the frozen reference model (None without a KL term)."""

    model: torch.nn.Module
    tokenizer: object
    backend: object
    task: object
    optimizer: torch.optim.Optimizer
    ref_model: torch.nn.Module | None = None
    # Pushes the policy's weights into the sampler after an update (None: the sampler is
    # the policy itself).
    sync: object = None
    # Frozen models of on-policy distillation by role (teacher, base, positive, negative);
    # empty without distillation.
    teachers: dict = field(default_factory=dict)
    # A diffusion policy's sampler block length (its estimators score block by block).
    block_length: int = 1


@dataclass
class TrainerState:
    step: int = 0
    # Rollouts generated so far (dropped groups included): the budget compared across methods.
    samples: int = 0
    prefix: object = None
    replay: object = None
    # RSTG: the teacher's solve rate and shortest correct trajectory per problem id.
    teacher_solve: dict = field(default_factory=dict)


def make_rows(groups, cfg: GRPORunConfig, step: int = 0) -> list[dict]:
    """One training row per rollout, with its advantage (and GAPO clip bound); a diffusion
    rollout also carries its trace and the seed of its log-prob masks."""
    a = cfg.algo
    adv_P_G = compute_advantages(a.advantage, AdvantageInput(groups.rewards_P_G, std_eps=a.std_eps,
                                                             unbiased_std=a.unbiased_std))
    clip_high_P_G = (gapo_clip_high(groups.correct_P_G, a.clip_low, a.gapo_clip_high_max)
                     if a.loss == "gapo" else None)
    adv_B = adv_P_G.reshape(-1).tolist()
    clip_B = clip_high_P_G.reshape(-1).tolist() if clip_high_P_G is not None else None
    reward_B = groups.rewards_P_G.reshape(-1).tolist()
    correct_B = groups.correct_P_G.reshape(-1).tolist()
    G = groups.rewards_P_G.shape[1]
    traces = groups.traces or [None] * len(adv_B)
    rows = [{"prompt_ids": groups.prompt_ids[b], "completion_ids": groups.completion_ids[b],
             "engine_logp": groups.engine_logp[b], "adv": adv_B[b], "reward": reward_B[b],
             "correct": correct_B[b], "clip_high": clip_B[b] if clip_B else None,
             "old_logp": None, "is_weight": None, "problem": groups.problems[b // G],
             "group": b // G, "trace": traces[b],
             "mask_seed": derive_seed(cfg.seed, "mask", step, b)}
            for b in range(len(adv_B))]
    return quadrature_rows(rows, cfg) if a.dllm.estimator == "quadrature" else rows


def quadrature_rows(rows: list[dict], cfg: GRPORunConfig) -> list[dict]:
    """SLIM-RL's deterministic quadrature: each rollout becomes one row per Gauss-Legendre
    level j with weight ``K w_j``, so sequence-mean aggregation over the B K rows gives
    ``(1/B) sum_b sum_j w_j L_bj``."""
    _, w_K = quadrature_levels(cfg.algo.dllm.quadrature_points)
    K = len(w_K)
    return [{**r, "level": j, "row_weight": float(K * w_K[j])} for r in rows for j in range(K)]


def _views(cfg: GRPORunConfig) -> list[int]:
    """The mask views whose log-probs are frozen: one per inner iteration (epoch) for an
    estimator whose masks change with it, else one."""
    return list(range(cfg.algo.epochs)) if estimator_spec(cfg.algo.dllm.estimator).per_view \
        else [0]


def _input(edges: Edges, model, rows: list[dict], cfg: GRPORunConfig, view: int = 0,
           full: bool = False, with_entropy: bool = True) -> EstimateInput:
    a = cfg.algo
    return EstimateInput(
        model=model, rows=rows, temperature=cfg.rollout.temperature,
        pad_id=edges.tokenizer.pad_token_id, mask_id=edges.tokenizer.mask_token_id,
        settings=a.dllm, block_length=edges.block_length, view=view, full=full,
        with_entropy=with_entropy, dopsd=a.distill.dopsd)


def _estimate(edges: Edges, model, rows: list[dict], cfg: GRPORunConfig, view: int = 0,
              full: bool = False, with_entropy: bool = True):
    return estimate(cfg.algo.dllm.estimator, _input(edges, model, rows, cfg, view, full,
                                                    with_entropy))


@torch.no_grad()
def _frozen_logp(edges: Edges, model, rows: list[dict], cfg: GRPORunConfig, view: int):
    """``(logp_B_T, mask_B_T)`` of ``rows`` under a model, micro-batch by micro-batch."""
    T = max(len(r["completion_ids"]) for r in rows)
    parts = [_estimate(edges, model, rows[s:s + cfg.micro_batch], cfg, view,
                       with_entropy=False) for s in range(0, len(rows), cfg.micro_batch)]
    logp_B_T = torch.cat([_pad_to(p.logp_B_T, T) for p in parts])
    return logp_B_T, torch.cat([_pad_to(p.mask_B_T, T) for p in parts])


def _pad_to(x_B_T: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(x_B_T, (0, T - x_B_T.shape[1]))


def _row_old(r: dict, epoch: int):
    return r["old_views"][epoch] if r.get("old_views") else r["old_logp"]


def _row_ref(r: dict, epoch: int):
    return r["ref_views"][epoch] if r.get("ref_views") else r["ref_logp"]


def needs_old_logp(cfg: GRPORunConfig) -> bool:
    a = cfg.algo
    return (a.is_correction.mode != "none" or a.epochs > 1 or a.mini_batches > 1
            or a.replay.enabled)


@torch.no_grad()
def freeze_behaviour(edges: Edges, rows: list[dict], cfg: GRPORunConfig) -> dict:
    """Fill ``old_logp`` and the mismatch weight of fresh rows (before any update)."""
    fresh = [r for r in rows if r["old_logp"] is None]
    if not fresh or not needs_old_logp(cfg):
        return {}
    views = _views(cfg)
    old = {v: _frozen_logp(edges, edges.model, fresh, cfg, v) for v in views}
    old_B_T, mask_B_T = old[0]
    engine_B_T = pad_rows([r["engine_logp"] or [] for r in fresh], old_B_T.shape[1],
                          old_B_T.device)
    # Rows the sampler did not produce (RSTG's teacher trajectories) get no correction.
    sampled_B_1 = torch.tensor([r["engine_logp"] is not None for r in fresh],
                               device=old_B_T.device)[:, None]
    engine_B_T = torch.where(sampled_B_1, engine_B_T, old_B_T)
    c = cfg.algo.is_correction
    w_B_T, m = is_weights(old_B_T, engine_B_T, mask_B_T, mode=c.mode, c_min=c.c_min,
                          c_max=c.c_max)
    for i, r in enumerate(fresh):
        n = len(r["completion_ids"])
        r["old_logp"] = old_B_T[i, :n].tolist()
        r["is_weight"] = w_B_T[i, :n].tolist()
        if len(views) > 1:
            r["old_views"] = [old[v][0][i, :n].tolist() for v in views]
    return {f"is/{k}": float(v) for k, v in m.items()}


@torch.no_grad()
def freeze_reference(edges: Edges, rows: list[dict], cfg: GRPORunConfig) -> None:
    """The frozen reference model's log-probs of fresh rows, computed once at birth: the
    reference never changes, so every epoch, mini-batch and later replay reuses them."""
    fresh = [r for r in rows if r.get("ref_logp") is None]
    if edges.ref_model is None or not fresh:
        return
    views = _views(cfg)
    ref = {v: _frozen_logp(edges, edges.ref_model, fresh, cfg, v)[0] for v in views}
    for i, r in enumerate(fresh):
        n = len(r["completion_ids"])
        r["ref_logp"] = ref[0][i, :n].tolist()
        if len(views) > 1:
            r["ref_views"] = [ref[v][i, :n].tolist() for v in views]


def _policy_logp(edges: Edges, rows: list[dict], cfg: GRPORunConfig, full: bool, view: int):
    """The policy's log-probs, entropy and mask for ``rows`` (with the graph), and the full
    distributions when a divergence method needs them."""
    e = _estimate(edges, edges.model, rows, cfg, view, full=full)
    return e.logp_B_T, e.entropy_B_T, e.mask_B_T, e.logp_B_T_V


def _divergence(edges: Edges, rows: list[dict], cfg: GRPORunConfig, kind: str,
                logp_B_T_V: torch.Tensor, mask_B_T: torch.Tensor) -> torch.Tensor:
    """Per-token divergence of the policy from the method's target distributions."""
    d = cfg.algo.distill
    if kind == "self_view":
        teacher = edges.teachers["base"] if d.dopsd.fixed_teacher else edges.model
        target_B_T_V = teacher_view_targets(
            teacher, rows, mask_B_T.shape[1], cfg.rollout.temperature,
            edges.tokenizer.pad_token_id, edges.tokenizer.mask_token_id, d.dopsd)
        return generalized_jsd(logp_B_T_V, target_B_T_V, mask_B_T, d.dopsd.beta)
    target_B_T_V, _ = target_logp(kind, edges.teachers, [r["prompt_ids"] for r in rows],
                                  [r["completion_ids"] for r in rows], cfg,
                                  edges.tokenizer.pad_token_id, mask_B_T.shape[1])
    beta, top_k, tail = divergence_params(kind, d)
    return generalized_jsd(logp_B_T_V, target_B_T_V, mask_B_T, beta, top_k=top_k,
                           tail_bucket=tail)


def _micro_loss(edges: Edges, rows: list[dict], cfg: GRPORunConfig, tokens: float, seqs: float,
                epoch: int = 0):
    """The loss of one micro-batch as its share of the mini-batch (global counts)."""
    a, d = cfg.algo, cfg.algo.distill
    kind = method_spec(d.method).divergence if d.method != "none" else None
    view = epoch if len(_views(cfg)) > 1 else 0
    logp_B_T, ent_B_T, mask_B_T, logp_B_T_V = _policy_logp(edges, rows, cfg, kind is not None,
                                                           view)
    T, dev = logp_B_T.shape[1], logp_B_T.device
    frozen = rows[0]["old_logp"] is not None
    old_B_T = (pad_rows([_row_old(r, view) for r in rows], T, dev) if frozen
               else logp_B_T.detach())
    if rows[0].get("adv_tokens") is not None:  # per-token advantages (distillation)
        adv_B_T = pad_rows([r["adv_tokens"] for r in rows], T, dev)
    else:
        adv_B_T = torch.tensor([r["adv"] for r in rows], device=dev)[:, None] * mask_B_T
    clip_B = (torch.tensor([r["clip_high"] for r in rows], dtype=torch.float64, device=dev)
              if rows[0]["clip_high"] is not None else None)
    inp = LossInput(logp_B_T=logp_B_T, old_logp_B_T=old_B_T, adv_B_T=adv_B_T, mask_B_T=mask_B_T,
                    clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
                    clip_high_B=clip_B,
                    is_weight_B_T=(pad_rows([r["is_weight"] for r in rows], T, dev)
                                   if frozen else None))
    loss_B_T, m = compute_loss(a.loss, inp)
    if rows[0].get("row_weight") is not None:  # quadrature levels
        loss_B_T = loss_B_T * torch.tensor([r["row_weight"] for r in rows], device=dev)[:, None]
    stats = {}
    gate_B_T = None
    if d.drift.enabled:
        gate_B_T = drift_gates(logp_B_T, old_B_T, mask_B_T, d.drift.block_size, d.drift.tau)
        loss_B_T = loss_B_T * gate_B_T
        # Summed over micro-batches (global token count): the mean |gate - 1| per token.
        stats["distill/gate_abs_dev"] = float(((gate_B_T - 1).abs() * mask_B_T).sum()) / tokens
    agg = dict(global_tokens=tokens, global_seqs=seqs, constant=cfg.rollout.max_tokens * seqs)
    pg = aggregate(loss_B_T, mask_B_T, a.aggregation, **agg)
    total = pg
    if logp_B_T_V is not None:
        div_B_T = _divergence(edges, rows, cfg, kind, logp_B_T_V, mask_B_T)
        if gate_B_T is not None:
            div_B_T = div_B_T * gate_B_T
        div = aggregate(div_B_T, mask_B_T, a.aggregation, **agg)
        total = total + d.kl_coef * div
        stats["distill/divergence"] = float(div.detach())
    entropy = aggregate(ent_B_T, mask_B_T, a.aggregation, **agg)
    if a.entropy_coef:
        total = total - a.entropy_coef * entropy
    kl = torch.zeros(())
    if edges.ref_model is not None:
        ref_B_T = pad_rows([_row_ref(r, view) for r in rows], T, dev)
        kl = aggregate(kl_estimate(a.kl.estimator, logp_B_T, ref_B_T), mask_B_T, a.aggregation,
                       **agg)
        total = total + a.kl.coef * kl
    total.backward()
    share = float(mask_B_T.sum()) / max(tokens, 1.0)
    stats.update({"grad/loss": float(total.detach()), "grad/pg_loss": float(pg.detach()),
                  "grad/entropy": float(entropy.detach()), "grad/kl": float(kl.detach())})
    stats.update({f"grad/{k}": float(v) * share for k, v in m.items()})
    return stats


def policy_update(edges: Edges, rows: list[dict], cfg: GRPORunConfig, step: int) -> dict:
    """``epochs`` passes of ``mini_batches`` optimizer steps over ``rows``; metrics are
    summed over micro-batches (they are shares of the mini-batch) and averaged over updates."""
    a, o = cfg.algo, cfg.optim
    # The warmup is a function of the step alone, so a resumed run needs no scheduler state.
    for group in edges.optimizer.param_groups:
        group["lr"] = o.lr * min(1.0, (step + 1) / o.warmup_steps) if o.warmup_steps else o.lr
    totals: dict[str, float] = {}
    updates = 0
    for epoch in range(a.epochs):
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(
            derive_seed(cfg.seed, "shuffle", step, epoch))).tolist()
        size = -(-len(rows) // a.mini_batches)
        for start in range(0, len(rows), size):
            mini = [rows[i] for i in order[start:start + size]]
            tokens = float(scored_tokens(a.dllm.estimator, _input(edges, edges.model, mini, cfg)))
            edges.optimizer.zero_grad(set_to_none=True)
            acc: dict[str, float] = {}
            for s in range(0, len(mini), cfg.micro_batch):
                part = _micro_loss(edges, mini[s:s + cfg.micro_batch], cfg, tokens, len(mini),
                                   epoch)
                for k, v in part.items():
                    acc[k] = acc.get(k, 0.0) + v
            params = [p for p in edges.model.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or float("inf"))
            edges.optimizer.step()
            acc["grad/grad_norm"] = float(norm)
            for k, v in acc.items():
                totals[k] = totals.get(k, 0.0) + v
            updates += 1
    return {k: v / max(updates, 1) for k, v in totals.items()} | {"grad/updates": float(updates)}


def step(edges: Edges, cfg: GRPORunConfig, state: TrainerState, problems: list):
    """One training step; returns the new state and the step's metrics."""
    t0 = time.perf_counter()
    prefix_cfg = prefix_controller_config(cfg) if cfg.algo.prefix.enabled else None
    groups, state.prefix, metrics = collect(edges, problems, cfg, state.step, state.prefix,
                                            prefix_cfg)
    state.samples += int(metrics.pop("samples/step"))
    t_gen = time.perf_counter() - t0
    rows = make_rows(groups, cfg, state.step) if groups.problems else []
    if edges.teachers and rows:
        rows, distill_metrics = distill_rows(edges, rows, cfg, state.step, state.teacher_solve)
        metrics.update(distill_metrics)
    metrics.update(freeze_behaviour(edges, rows, cfg))
    freeze_reference(edges, rows, cfg)
    if state.replay is not None:
        # The version of a rollout is the step it was born in (one update per step unless
        # mini_batches > 1); compose evicts by age, keeps every fresh rollout, adds replayed.
        fresh = len(rows)
        gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "replay", state.step))
        items = state.replay.compose([(r, r["adv"]) for r in rows], cfg.algo.replay.replay_ratio,
                                     state.step, gen)
        rows = [it.payload for it in items]
        metrics.update({"replay/size": float(len(state.replay)),
                        "replay/used": float(len(rows) - fresh)})
    t1 = time.perf_counter()
    if rows:
        metrics.update(policy_update(edges, rows, cfg, state.step))
        if edges.sync is not None:
            edges.sync()
    state.step += 1
    t2 = time.perf_counter()
    tokens = sum(len(r["completion_ids"]) for r in rows)
    metrics.update({"samples/generated": float(state.samples), "perf/gen_s": t_gen,
                    "perf/train_s": t2 - t1, "perf/step_s": t2 - t0,
                    "perf/tokens_per_s": tokens / max(t2 - t0, 1e-9)})
    return state, metrics


def save(edges: Edges, cfg: GRPORunConfig, state: TrainerState, folder: Path,
         resume: str) -> None:
    """An HF checkpoint plus ``trainer_state.pt``: optimizer, step (the data position),
    sample count, prefix controller and replay buffer, enough for ``--resume``."""
    def extra(tmp: Path) -> None:
        torch.save({"step": state.step, "samples": state.samples,
                    "optimizer": edges.optimizer.state_dict(),
                    "prefix": state.prefix.to_dict() if state.prefix is not None else None,
                    "replay": state.replay.state_dict() if state.replay is not None else None},
                   tmp / "trainer_state.pt")
    with written(folder, resume):
        save_hf_checkpoint(edges.model, edges.tokenizer, folder, data_from=cfg.model,
                           extra=extra)


def run(cfg: GRPORunConfig, edges: Edges, problems: list, out: Path, state: TrainerState,
        progress: bool = True, command: str = "grpo") -> TrainerState:
    """Train up to ``cfg.steps`` from ``state`` (a fresh one, or one restored by resume)."""
    again = f"es-llm {command} --resume {out}"
    kept = [m for m in complete_jsonl_rows(out / "metrics.jsonl") if m.get("step", 0) < state.step]
    for name, text in (("config.yaml", run_config_yaml(cfg)),
                       ("metrics.jsonl", "".join(json.dumps(m) + "\n" for m in kept))):
        with written(out / name, again):
            out.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out / name, text)
    bar = tqdm(range(state.step, cfg.steps), desc=command, unit="step", disable=not progress,
               initial=state.step, total=cfg.steps)
    log = AppendLog(out / "metrics.jsonl", again)
    try:
        for it in bar:
            state, metrics = step(edges, cfg, state, problems)
            log.write(json.dumps({"step": it, **metrics}) + "\n")
            bar.write(f"step {it:4d}  reward {metrics['reward/mean']:.3f}  "
                      f"correct {metrics['reward/correct']:.3f}  "
                      f"loss {metrics.get('grad/loss', 0.0):+.4f}  "
                      f"clip {metrics.get('grad/clipfrac', 0.0):.3f}  "
                      f"{metrics['perf/step_s']:.1f} s")
            if (it + 1) % cfg.checkpoint_every == 0 and it + 1 < cfg.steps:
                save(edges, cfg, state, out / "checkpoints" / f"step_{it + 1}", again)
    finally:
        log.close()
    save(edges, cfg, state, out / "checkpoints" / "final", again)
    return state
