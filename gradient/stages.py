"""Methods as registered stages: what a step does to its rollouts at birth, and the terms its
loss is made of.

A **birth stage** takes the step's ``RolloutBatch`` and returns a new one plus metrics: the
reward advantages, GAPO's clip bounds, quadrature levels, a distillation transform,
LatentRevise's recovered rows, the frozen behaviour and reference log-probs, replay. A **loss term** turns one micro-batch's
policy estimate into per-token losses with a coefficient: the policy loss, the distillation
divergence, the entropy bonus, the KL to the reference. Each term is aggregated on its own
and the terms are summed in plan order (the sum of aggregates, not the aggregate of the sum,
which is the same number in exact arithmetic but not in floating point). A term marked
``gated`` is multiplied by the drift gate first, when the plan has one.

``plan`` picks both lists once from the config and the registered declarations of the
method's parts (a loss that needs per-row clip bounds, an estimator that expands rollouts,
a distillation method's divergence); ``gradient.trainer`` runs them and never looks at a
method's name. Adding a method is adding a stage or a term with its ``when`` and a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from gradient.advantages import AdvantageInput, compute_advantages
from gradient.batch import PaddedBatch, RolloutBatch
from gradient.config import GRPORunConfig
from gradient.distill.drift_gate import drift_gates
from gradient.distill.methods import method_spec
from gradient.dllm.estimators import EstimateInput, estimate, estimator_spec
from gradient.kl import kl_estimate
from gradient.logprobs import pad_rows
from gradient.losses import LossInput, compute_loss, gapo_clip_high, needs_row_clip
from populations.registry import Registry
from gradient.rollout_correction import corrects, is_weights
from gradient.seeds import derive_seed


@dataclass
class StageInput:
    """What a birth stage may read: the loop's edges, the config, the step's state."""

    edges: object
    cfg: GRPORunConfig
    state: object


@dataclass(frozen=True)
class Stage:
    fn: Callable[[StageInput, RolloutBatch], tuple[RolloutBatch, dict]]
    # Whether a run with this config (and its edges) has the stage.
    when: Callable[[GRPORunConfig, object], bool]
    # Also run when the step kept no rollout (dynamic sampling dropped every group).
    on_empty: bool = False


@dataclass(frozen=True)
class TermInput:
    """One micro-batch: its rollouts and padded tensors, and the policy's estimate."""

    edges: object
    cfg: GRPORunConfig
    batch: RolloutBatch
    padded: PaddedBatch
    logp_B_T: torch.Tensor
    # The behaviour log-probs of the ratio: frozen ones, or sg(logp_B_T).
    old_logp_B_T: torch.Tensor
    entropy_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    logp_B_T_V: torch.Tensor | None
    # Global token count of the mini-batch (the micro-batch's share of metrics).
    tokens: float


@dataclass(frozen=True)
class TermOutput:
    loss_B_T: torch.Tensor
    # Weight of the aggregated term in the loss; 0 = logged only.
    coef: float
    # Metric key of the aggregated term.
    key: str
    # Multiplied by the drift gate (when the plan has one) before aggregation.
    gated: bool = False
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Term:
    fn: Callable[[TermInput], TermOutput]
    when: Callable[[GRPORunConfig, object], bool]
    # The term reads the policy's full next-token distributions.
    full: bool = False


BIRTH: Registry[Stage] = Registry("birth stage")
TERMS: Registry[Term] = Registry("loss term")
# Plan order: registration order (the order below is the order a step runs them in).
_BIRTH_ORDER: list[str] = []
_TERM_ORDER: list[str] = []


def birth_stage(name: str, when: Callable[[GRPORunConfig, object], bool],
                on_empty: bool = False):
    def decorator(fn):
        BIRTH.register(name)(Stage(fn, when, on_empty))
        _BIRTH_ORDER.append(name)
        return fn
    return decorator


def loss_term(name: str, when: Callable[[GRPORunConfig, object], bool], full: bool = False):
    def decorator(fn):
        TERMS.register(name)(Term(fn, when, full))
        _TERM_ORDER.append(name)
        return fn
    return decorator


@dataclass(frozen=True)
class Plan:
    birth: tuple[str, ...]
    terms: tuple[str, ...]
    # The policy estimate must include full distributions (a divergence term).
    full: bool
    # Drift gates on the gated terms (BPDG).
    gated: bool


def plan(cfg: GRPORunConfig, edges) -> Plan:
    """The stages and terms of a run, chosen once from the config and the declarations."""
    terms = tuple(n for n in _TERM_ORDER if TERMS.get(n).when(cfg, edges))
    return Plan(birth=tuple(n for n in _BIRTH_ORDER if BIRTH.get(n).when(cfg, edges)),
                terms=terms, full=any(TERMS.get(n).full for n in terms),
                gated=cfg.algo.distill.drift.enabled)


def run_birth(stages: tuple[str, ...], inp: StageInput, batch: RolloutBatch
              ) -> tuple[RolloutBatch, dict]:
    metrics: dict = {}
    for name in stages:
        stage = BIRTH.get(name)
        if len(batch) or stage.on_empty:
            batch, m = stage.fn(inp, batch)
            metrics.update(m)
    return batch, metrics


# --- estimates -----------------------------------------------------------------------------

def views(cfg: GRPORunConfig) -> list[int]:
    """The mask views whose log-probs are frozen: one per inner iteration (epoch) for an
    estimator whose masks change with it, else one."""
    return list(range(cfg.algo.epochs)) if estimator_spec(cfg.algo.dllm.estimator).per_view \
        else [0]


def estimate_input(edges, model, rows, cfg: GRPORunConfig, view: int = 0, full: bool = False,
                   with_entropy: bool = True) -> EstimateInput:
    a = cfg.algo
    return EstimateInput(
        model=model, rows=tuple(rows), temperature=cfg.rollout.temperature,
        pad_id=edges.tokenizer.pad_token_id, mask_id=edges.tokenizer.mask_token_id,
        settings=a.dllm, block_length=edges.block_length, view=view, full=full,
        with_entropy=with_entropy, dopsd=a.distill.dopsd)


def policy_estimate(edges, model, rows, cfg: GRPORunConfig, view: int = 0, full: bool = False,
                    with_entropy: bool = True):
    return estimate(cfg.algo.dllm.estimator,
                    estimate_input(edges, model, rows, cfg, view, full, with_entropy))


@torch.no_grad()
def _frozen_logp(edges, model, batch: RolloutBatch, cfg: GRPORunConfig, view: int):
    """``(logp_B_T, mask_B_T)`` of ``batch`` under a model, micro-batch by micro-batch."""
    T = max(len(r.completion_ids) for r in batch)
    parts = [policy_estimate(edges, model, batch[s:s + cfg.micro_batch], cfg, view,
                             with_entropy=False) for s in range(0, len(batch), cfg.micro_batch)]
    logp_B_T = torch.cat([_pad_to(p.logp_B_T, T) for p in parts])
    return logp_B_T, torch.cat([_pad_to(p.mask_B_T, T) for p in parts])


def _pad_to(x_B_T: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(x_B_T, (0, T - x_B_T.shape[1]))


# --- birth stages, in the order a step runs them ---------------------------------------------

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


def _distills(cfg: GRPORunConfig, edges) -> bool:
    return bool(edges.teachers)


@birth_stage("distill", when=_distills)
def distill(inp: StageInput, batch: RolloutBatch):
    """The distillation method's per-token advantages, kept rollouts and SFT rows."""
    from gradient.distill.birth import distill_rows

    return distill_rows(inp.edges, batch, inp.cfg, inp.state.step, inp.state.teacher_solve)


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
                      mask_seed=derive_seed(cfg.seed, "recovered", inp.state.step, g),
                      off_policy=True)
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
    old = {v: _frozen_logp(edges, edges.model, fresh, cfg, v) for v in vs}
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
    ref = {v: _frozen_logp(edges, edges.ref_model, fresh, cfg, v)[0] for v in vs}
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
    is the step it was born in; compose evicts by age before it draws."""
    cfg, state = inp.cfg, inp.state
    fresh = len(batch)
    gen = torch.Generator().manual_seed(derive_seed(cfg.seed, "replay", state.step))
    items = state.replay.compose([(r, r.adv) for r in batch], cfg.algo.replay.replay_ratio,
                                 state.step, gen)
    out = RolloutBatch.of([it.payload for it in items])
    return out, {"replay/size": float(len(state.replay)), "replay/used": float(len(out) - fresh)}


# --- loss terms, in the order they are summed ------------------------------------------------

@loss_term("policy", when=lambda cfg, edges: True)
def policy(inp: TermInput) -> TermOutput:
    """The configured policy loss on the advantages (quadrature rows weighted)."""
    a, p = inp.cfg.algo, inp.padded
    loss_B_T, m = compute_loss(a.loss, LossInput(
        logp_B_T=inp.logp_B_T, old_logp_B_T=inp.old_logp_B_T, adv_B_T=p.adv_B_T,
        mask_B_T=inp.mask_B_T, clip_low=a.clip_low, clip_high=a.clip_high,
        dual_clip=a.dual_clip, clip_high_B=p.clip_high_B, is_weight_B_T=p.is_weight_B_T))
    if p.row_weight_B is not None:
        loss_B_T = loss_B_T * p.row_weight_B[:, None]
    share = float(inp.mask_B_T.sum()) / max(inp.tokens, 1.0)
    return TermOutput(loss_B_T, 1.0, "grad/pg_loss", gated=True,
                      metrics={f"grad/{k}": float(v) * share for k, v in m.items()})


def _divergence_of(cfg: GRPORunConfig, edges):
    d = cfg.algo.distill
    return method_spec(d.method).divergence if edges.teachers else None


@loss_term("divergence", when=lambda cfg, edges: _divergence_of(cfg, edges) is not None,
           full=True)
def divergence(inp: TermInput) -> TermOutput:
    """The distillation method's full-distribution divergence from its target."""
    fn = _divergence_of(inp.cfg, inp.edges)
    div_B_T = fn(inp.edges, inp.batch, inp.cfg, inp.logp_B_T_V, inp.mask_B_T)
    return TermOutput(div_B_T, inp.cfg.algo.distill.kl_coef, "distill/divergence", gated=True)


@loss_term("entropy", when=lambda cfg, edges: True)
def entropy(inp: TermInput) -> TermOutput:
    """The policy's entropy: a bonus with ``entropy_coef``, logged always."""
    return TermOutput(inp.entropy_B_T, -inp.cfg.algo.entropy_coef, "grad/entropy")


@loss_term("kl", when=lambda cfg, edges: edges.ref_model is not None)
def kl(inp: TermInput) -> TermOutput:
    """The configured KL estimator to the frozen reference model."""
    a = inp.cfg.algo
    return TermOutput(kl_estimate(a.kl.estimator, inp.logp_B_T, inp.padded.ref_logp_B_T),
                      a.kl.coef, "grad/kl")


def gate(inp: TermInput) -> tuple[torch.Tensor, dict]:
    """BPDG's drift gates ``(B, T)`` between the policy and the behaviour log-probs."""
    d = inp.cfg.algo.distill.drift
    gate_B_T = drift_gates(inp.logp_B_T, inp.old_logp_B_T, inp.mask_B_T, d.block_size, d.tau)
    # Summed over micro-batches (global token count): the mean |gate - 1| per token.
    dev = float(((gate_B_T - 1).abs() * inp.mask_B_T).sum()) / inp.tokens
    return gate_B_T, {"distill/gate_abs_dev": dev}
