"""The GRPO-family training loop: generate -> score -> advantages -> loss -> optimizer step.

``step`` is one step, ``run`` the whole job. Every method difference is a registered function
picked by name from the config (advantages, policy loss, aggregation, KL estimator, log-prob
estimator, distillation method), a birth stage or loss term of the run's ``plan.Plan``
(chosen once from the config and those functions' declarations), or a switch on the data
side (dynamic sampling, overlong shaping, prefixes); the loop itself has no per-method
branches. Rollouts travel as a typed ``batch.RolloutBatch``.

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
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from es_llm.config import run_config_yaml
from es_llm.errors import NonFinite
from es_llm.finite import Diverged, check, check_update, stop_error
from es_llm.io import complete_jsonl_rows, write_text_atomic
from es_llm.run_folder import AppendLog, written
from es_llm.tasks.base import too_long_notice
from gradient.config import GRPORunConfig
from gradient.dllm.estimators import scored_tokens
from gradient.loop.adapter import save_policy
from gradient.loop.batch import RolloutBatch
from gradient.loop.birth_stages import StageInput
from gradient.loop.estimates import estimate_input, policy_estimate, views
from gradient.loop.loss_terms import TERMS, TermInput, gate
from gradient.loop.plan import Plan, plan, run_birth
from gradient.loop.rollouts import collect
from gradient.loop.seeds import derive_seed
from gradient.loop.state import Edges, TrainerState
from gradient.maths.aggregation import aggregate


def _micro_loss(edges: Edges, batch: RolloutBatch, cfg: GRPORunConfig, tokens: float,
                seqs: float, epoch: int = 0, steps: Plan | None = None):
    """The loss of one micro-batch as its share of the mini-batch (global counts): every term
    of the plan aggregated, gated terms multiplied by the drift gate first, then summed."""
    steps = steps or plan(cfg, edges)
    view = epoch if len(views(cfg)) > 1 else 0
    with edges.precision.compute():
        total, stats = _micro_terms(edges, batch, cfg, tokens, seqs, view, steps)
    check("loss", "grad/loss", stats["grad/loss"], bool(edges.optimizer.state), stats)
    edges.precision.backward(total)
    return stats


def _micro_terms(edges: Edges, batch: RolloutBatch, cfg: GRPORunConfig, tokens: float,
                 seqs: float, view: int, steps: Plan):
    """The micro-batch's forward pass: its total loss and metrics."""
    e = policy_estimate(edges, edges.model, batch, cfg, view, full=steps.full)
    padded = batch.padded(e.mask_B_T, view)
    inp = TermInput(edges=edges, cfg=cfg, batch=batch, padded=padded, logp_B_T=e.logp_B_T,
                    old_logp_B_T=(padded.old_logp_B_T if padded.old_logp_B_T is not None
                                  else e.logp_B_T.detach()),
                    entropy_B_T=e.entropy_B_T, mask_B_T=e.mask_B_T, logp_B_T_V=e.logp_B_T_V,
                    tokens=tokens)
    stats: dict[str, float] = {"grad/kl": 0.0}
    gate_B_T = None
    if steps.gated:
        gate_B_T, m = gate(inp)
        stats.update(m)
    agg = dict(global_tokens=tokens, global_seqs=seqs, constant=cfg.rollout.max_tokens * seqs)
    total = None
    for name in steps.terms:
        out = TERMS.get(name).fn(inp)
        loss_B_T = out.loss_B_T * gate_B_T if out.gated and gate_B_T is not None \
            else out.loss_B_T
        value = aggregate(loss_B_T, e.mask_B_T, cfg.algo.aggregation, **agg)
        stats[out.key] = float(value.detach())
        stats.update(out.metrics)
        if total is None:
            total = value * out.coef if out.coef != 1.0 else value
        elif out.coef:
            total = total + out.coef * value
    stats["grad/loss"] = float(total.detach())
    return total, stats


def policy_update(edges: Edges, batch: RolloutBatch, cfg: GRPORunConfig, step: int,
                  steps: Plan) -> dict:
    """``epochs`` passes of ``mini_batches`` optimizer steps over ``batch``; metrics are
    summed over micro-batches (they are shares of the mini-batch) and averaged over updates."""
    a = cfg.algo
    cfg.optim.set_lr(edges.optimizer, step)
    totals: dict[str, float] = {}
    updates = 0
    for epoch in range(a.epochs):
        order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(
            derive_seed(cfg.seed, "shuffle", step, epoch))).tolist()
        size = -(-len(batch) // a.mini_batches)
        for start in range(0, len(batch), size):
            mini = batch.take(order[start:start + size])
            tokens = float(scored_tokens(a.dllm.estimator,
                                         estimate_input(edges, edges.model, mini, cfg)))
            edges.optimizer.zero_grad(set_to_none=True)
            acc: dict[str, float] = {}
            for s in range(0, len(mini), cfg.micro_batch):
                part = _micro_loss(edges, mini[s:s + cfg.micro_batch], cfg, tokens, len(mini),
                                   epoch, steps)
                for k, v in part.items():
                    acc[k] = acc.get(k, 0.0) + v
            params = [p for p in edges.model.parameters() if p.grad is not None]
            edges.precision.unscale(edges.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or float("inf"))
            if not edges.precision.overflowed(float(norm)):
                check("gradient norm", "grad/grad_norm", float(norm),
                      bool(edges.optimizer.state), acc)
            acc.update({f"grad/{k}": v for k, v in edges.precision.step(edges.optimizer).items()})
            check_update(params, "grad/update", acc)
            acc["grad/grad_norm"] = float(norm)
            for k, v in acc.items():
                totals[k] = totals.get(k, 0.0) + v
            updates += 1
    return {k: v / max(updates, 1) for k, v in totals.items()} | {"grad/updates": float(updates)}


def step(edges: Edges, cfg: GRPORunConfig, state: TrainerState, problems: list,
         steps: Plan | None = None):
    """One training step; returns the new state and the step's metrics."""
    steps = steps or plan(cfg, edges)
    t0 = time.perf_counter()
    prefix_cfg = cfg.algo.prefix if cfg.algo.prefix.enabled else None
    try:
        with edges.precision.compute():
            groups, state.prefix, metrics = collect(edges, problems, cfg, state.step,
                                                    state.prefix, prefix_cfg)
    except NonFinite:
        # The sampler met NaN or inf next-token logits: the policy has left the numbers.
        raise Diverged("next-token logits", "rollout/logits", math.nan,
                       bool(edges.optimizer.state)) from None
    state.samples += int(metrics.pop("samples/step"))
    t_gen = time.perf_counter() - t0
    batch = (RolloutBatch.from_groups(groups, cfg.seed, state.step) if groups.problems
             else RolloutBatch())
    with edges.precision.compute():
        batch, birth_metrics = run_birth(steps.birth, StageInput(edges, cfg, state), batch)
    metrics.update(birth_metrics)
    t1 = time.perf_counter()
    if len(batch):
        try:
            metrics.update(policy_update(edges, batch, cfg, state.step, steps))
        except Diverged as exc:
            exc.metrics = {**metrics, **exc.metrics}  # the rollouts' figures too
            raise
        if edges.sync is not None:
            edges.sync()
    state.step += 1
    t2 = time.perf_counter()
    metrics.update({"samples/generated": float(state.samples), "perf/gen_s": t_gen,
                    "perf/train_s": t2 - t1, "perf/step_s": t2 - t0,
                    "perf/tokens_per_s": batch.tokens() / max(t2 - t0, 1e-9)})
    return state, metrics


def save(edges: Edges, cfg: GRPORunConfig, state: TrainerState, folder: Path,
         resume: str) -> None:
    """An HF checkpoint plus ``trainer_state.pt``: optimizer, step (the data position),
    sample count, prefix controller and replay buffer, enough for ``--resume`` (with
    ``lora``, the merged model plus the adapter the run continues from)."""
    def extra(tmp: Path) -> None:
        torch.save({"step": state.step, "samples": state.samples,
                    "optimizer": edges.optimizer.state_dict(),
                    "loss_scale": edges.precision.state_dict(),
                    "prefix": state.prefix.to_dict() if state.prefix is not None else None,
                    "replay": state.replay.state_dict() if state.replay is not None else None},
                   tmp / "trainer_state.pt")
    with written(folder, resume):
        save_policy(edges.model, edges.tokenizer, folder, cfg.lora, cfg.model, extra=extra)


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
    steps = plan(cfg, edges)
    said_too_long = False
    try:
        for it in bar:
            try:
                state, metrics = step(edges, cfg, state, problems, steps)
            except Diverged as exc:
                log.write_row(exc.row(step=it))
                raise stop_error(exc, "step", it, cfg.optim.advice(), out) from None
            log.write_row({"step": it, **metrics})
            bar.write(f"step {it:4d}  reward {metrics['reward/mean']:.3f}  "
                      f"correct {metrics['reward/correct']:.3f}  "
                      f"loss {metrics.get('grad/loss', 0.0):+.4f}  "
                      f"clip {metrics.get('grad/clipfrac', 0.0):.3f}  "
                      f"{metrics['perf/step_s']:.1f} s")
            if metrics["rollout/too_long"] and not said_too_long:
                said_too_long = True
                bar.write(too_long_notice(int(metrics["rollout/too_long"]),
                                          cfg.task.max_completion_chars, f"of step {it}",
                                          "rollout/too_long"))
            if (it + 1) % cfg.checkpoint_every == 0 and it + 1 < cfg.steps:
                save(edges, cfg, state, out / "checkpoints" / f"step_{it + 1}", again)
    finally:
        log.close()
    save(edges, cfg, state, out / "checkpoints" / "final", again)
    return state
