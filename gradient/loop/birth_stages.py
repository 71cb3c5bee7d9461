"""Birth stages: what a step does to its fresh rollouts once, before any update.

Each stage takes the step's ``RolloutBatch`` and returns a new one plus metrics: the reward
advantages, GAPO's clip bounds, quadrature levels, a distillation transform, LatentRevise's
recovered rows, the frozen behaviour and reference log-probs, replay. Its ``when`` says from
the config and the edges whether a run has it; where it runs among the others is declared in
``gradient.loop.plan.BIRTH_ORDER``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from gradient.config import GRPORunConfig
from gradient.dllm.estimators import estimator_spec
from gradient.loop.batch import RolloutBatch
from gradient.loop.estimates import frozen_logp, views
from gradient.loop.seeds import derive_seed
from gradient.loop.state import Edges, TrainerState
from gradient.maths.advantages import AdvantageInput, compute_advantages
from gradient.maths.logprobs import pad_rows
from gradient.maths.losses import gapo_clip_high, needs_row_clip
from gradient.maths.rollout_correction import corrects, is_weights
from populations.registry import Registry


@dataclass
class StageInput:
    """What a birth stage may read: the loop's edges, the config, the step's state."""

    edges: Edges
    cfg: GRPORunConfig
    state: TrainerState


@dataclass(frozen=True)
class Stage:
    fn: Callable[[StageInput, RolloutBatch], tuple[RolloutBatch, dict]]
    # Whether a run with this config (and its edges) has the stage.
    when: Callable[[GRPORunConfig, Edges], bool]
    # Also run when the step kept no rollout (dynamic sampling dropped every group).
    on_empty: bool = False


BIRTH: Registry[Stage] = Registry("birth stage")


def birth_stage(name: str, when: Callable[[GRPORunConfig, Edges], bool],
                on_empty: bool = False):
    """Decorator registering ``fn(StageInput, RolloutBatch) -> (RolloutBatch, metrics)``;
    its place among the stages is its place in ``plan.BIRTH_ORDER``."""
    def decorator(fn):
        BIRTH.register(name)(Stage(fn, when, on_empty))
        return fn
    return decorator


@birth_stage("advantages", when=lambda cfg, edges: True)
def advantages(inp: StageInput, batch: RolloutBatch):
    """The configured estimator's advantage of each rollout within its group of G."""
    a = inp.cfg.algo
    rewards_P_G = torch.tensor([r.reward for r in batch], dtype=torch.float64).view(
        -1, inp.cfg.rollout.group_size)
    adv_B = compute_advantages(a.advantage, AdvantageInput(
        rewards_P_G, std_eps=a.std_eps, unbiased_std=a.unbiased_std)).reshape(-1)
    return (batch.with_fields([{"adv": v} for v in adv_B.tolist()]),
            {"adv/abs_mean": float(adv_B.abs().mean())})


@birth_stage("row_clip_bounds", when=lambda cfg, edges: needs_row_clip(cfg.algo.loss))
def row_clip_bounds(inp: StageInput, batch: RolloutBatch):
    """GAPO's upper clip width per rollout, from its group's number of correct rollouts."""
    a = inp.cfg.algo
    correct_P_G = torch.tensor([r.correct for r in batch]).view(-1, inp.cfg.rollout.group_size)
    clip_B = gapo_clip_high(correct_P_G, a.clip_low, a.gapo_clip_high_max).reshape(-1)
    return (batch.with_fields([{"clip_high": v} for v in clip_B.tolist()]),
            {"gapo/clip_high_mean": float(clip_B.mean()),
             "gapo/clip_high_max": float(clip_B.max())})


@birth_stage("estimator_rows", when=lambda cfg, edges:
             estimator_spec(cfg.algo.dllm.estimator).expand is not None)
def estimator_rows(inp: StageInput, batch: RolloutBatch):
    """The rows an estimator scores per rollout (SLIM-RL: one per quadrature level)."""
    return estimator_spec(inp.cfg.algo.dllm.estimator).expand(batch, inp.cfg.algo.dllm), {}


def _distills(cfg: GRPORunConfig, edges: Edges) -> bool:
    return bool(edges.teachers)


@birth_stage("distill", when=_distills)
def distill(inp: StageInput, batch: RolloutBatch):
    """The distillation method's per-token advantages, kept rollouts and any rows it adds."""
    from gradient.distill.birth import distill_rows

    return distill_rows(inp.edges, batch, inp.cfg, inp.state.step, inp.state.distill_memo)


@birth_stage("recovered_rows", when=lambda cfg, edges: bool(cfg.algo.recovered.data))
def recovered_rows(inp: StageInput, batch: RolloutBatch):
    """LatentRevise's use in RLVR: a group whose G rollouts all failed (no reward signal) gets
    its problem's recovered trajectory as row G+1, and the group's advantages are those of
    the configured estimator over all G+1 rewards (so the recovered row is pushed up, the
    failures down).

    The row is off-policy and has no behaviour probability: its prefix was decoded from a
    continuous optimisation and its continuation sampled from the base model after it. So
    no importance weight is applied (is_weight 1, as for RSTG's teacher rows) and the
    behaviour log-probs are the current policy's (the ratio is 1 at birth; with several
    epochs or mini-batches it is clipped like every other row's): its gradient is the
    advantage times the gradient of its log-likelihood, a weighted SFT step, in the spirit of
    LUFFY's off-policy rows without their policy shaping. Groups with a success, and
    problems without a recovered trajectory, are left as they are."""
    a, cfg = inp.cfg.algo, inp.cfg
    groups: dict[int, list] = {}
    for r in batch:
        groups.setdefault(r.group, []).append(r)
    out, added, zero = [], 0, 0
    for g, rows in groups.items():
        extra = inp.edges.recovered.get(rows[0].problem.id) if not any(
            r.correct for r in rows) else None
        zero += not any(r.correct for r in rows)
        if extra is None:
            out += rows
            continue
        prompt_ids, completion_ids, reward = extra
        rewards_1_G = torch.tensor([[r.reward for r in rows] + [reward]], dtype=torch.float64)
        adv = compute_advantages(a.advantage, AdvantageInput(
            rewards_1_G, std_eps=a.std_eps, unbiased_std=a.unbiased_std))[0].tolist()
        row = replace(rows[0], prompt_ids=list(prompt_ids), completion_ids=list(completion_ids),
                      engine_logp=None, reward=reward, correct=True, trace=None,
                      mask_seed=derive_seed(cfg.seed, "recovered", inp.state.step, g))
        out += [replace(r, adv=v) for r, v in zip(rows + [row], adv)]
        added += 1
    return RolloutBatch.of(out), {"recovered/rows": float(added),
                                  "recovered/zero_hit_groups": float(zero)}


def needs_old_logp(cfg: GRPORunConfig) -> bool:
    """Whether a ratio can differ from 1 (so the behaviour log-probs must be frozen)."""
    a = cfg.algo
    return (corrects(a.is_correction.mode) or a.epochs > 1 or a.mini_batches > 1
            or a.replay.enabled)


@birth_stage("freeze_behaviour", when=lambda cfg, edges: needs_old_logp(cfg))
@torch.no_grad()
def freeze_behaviour(inp: StageInput, batch: RolloutBatch):
    """The trainer's log-probs of fresh rollouts before any update and the mismatch weight
    against the sampler (TIS/MIS); replayed rollouts keep theirs."""
    edges, cfg = inp.edges, inp.cfg
    fresh = RolloutBatch.of([r for r in batch if r.old_logp is None])
    if not len(fresh):
        return batch, {}
    vs = views(cfg)
    old = {v: frozen_logp(edges, edges.model, fresh, cfg, v) for v in vs}
    old_B_T, mask_B_T = old[0]
    engine_B_T = pad_rows([r.engine_logp or [] for r in fresh], old_B_T.shape[1],
                          old_B_T.device)
    # Rows the sampler did not produce (RSTG's teacher trajectories) get no correction.
    sampled_B_1 = torch.tensor([r.engine_logp is not None for r in fresh],
                               device=old_B_T.device)[:, None]
    engine_B_T = torch.where(sampled_B_1, engine_B_T, old_B_T)
    c = cfg.algo.is_correction
    w_B_T, m = is_weights(old_B_T, engine_B_T, mask_B_T, mode=c.mode, c_min=c.c_min,
                          c_max=c.c_max)
    values = []
    for i, r in enumerate(fresh):
        n = len(r.completion_ids)
        values.append({"old_logp": old_B_T[i, :n].tolist(), "is_weight": w_B_T[i, :n].tolist(),
                       "old_views": (tuple(old[v][0][i, :n].tolist() for v in vs)
                                     if len(vs) > 1 else None)})
    return _merge(batch, fresh, fresh.with_fields(values)), {f"is/{k}": float(v)
                                                              for k, v in m.items()}


@birth_stage("freeze_reference", when=lambda cfg, edges: edges.ref_model is not None)
@torch.no_grad()
def freeze_reference(inp: StageInput, batch: RolloutBatch):
    """The frozen reference model's log-probs of fresh rollouts, once at birth: every epoch,
    mini-batch and later replay reuses them."""
    edges, cfg = inp.edges, inp.cfg
    fresh = RolloutBatch.of([r for r in batch if r.ref_logp is None])
    if not len(fresh):
        return batch, {}
    vs = views(cfg)
    ref = {v: frozen_logp(edges, edges.ref_model, fresh, cfg, v)[0] for v in vs}
    values = [{"ref_logp": ref[0][i, :len(r.completion_ids)].tolist(),
               "ref_views": (tuple(ref[v][i, :len(r.completion_ids)].tolist() for v in vs)
                             if len(vs) > 1 else None)}
              for i, r in enumerate(fresh)]
    return _merge(batch, fresh, fresh.with_fields(values)), {}


def _merge(batch: RolloutBatch, old: RolloutBatch, new: RolloutBatch) -> RolloutBatch:
    """``batch`` with each rollout of ``old`` replaced by its counterpart in ``new``."""
    swap = {id(o): n for o, n in zip(old, new, strict=True)}
    return RolloutBatch.of([swap.get(id(r), r) for r in batch])


@birth_stage("replay", when=lambda cfg, edges: cfg.algo.replay.enabled, on_empty=True)
def replay(inp: StageInput, batch: RolloutBatch):
    """Advantage replay: every fresh rollout, then replayed ones. The version of a rollout
    is the step it was born in; compose evicts by age before it draws. A rollout's priority
    is its advantage (a per-token one's mean over the tokens)."""
    cfg, state = inp.cfg, inp.state
    fresh = len(batch)
    gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "replay", state.step))
    items = state.replay.compose([(r, r.mean_adv()) for r in batch],
                                 cfg.algo.replay.replay_ratio, state.step, gen)
    out = RolloutBatch.of([it.payload for it in items])
    return out, {"replay/size": float(len(state.replay)), "replay/used": float(len(out) - fresh)}
