"""Loss terms: what one micro-batch's loss is made of.

A term turns the policy's estimate on a micro-batch into per-token losses with a coefficient:
the policy loss, the distillation divergence, the entropy bonus, the KL to the reference.
Each is aggregated on its own and the terms are summed in the order declared in
``gradient.loop.plan.TERM_ORDER`` (the sum of aggregates, not the aggregate of the sum, which
is the same number in exact arithmetic but not in floating point). A term marked ``gated``
is multiplied by the drift gate first, when the plan has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gradient.config import GRPORunConfig
from gradient.distill.drift_gate import drift_gates
from gradient.distill.methods import method_spec
from gradient.loop.batch import PaddedBatch, RolloutBatch
from gradient.loop.state import Edges
from gradient.maths.kl import kl_estimate
from gradient.maths.losses import LossInput, compute_loss
from populations.registry import Registry


@dataclass(frozen=True)
class TermInput:
    """One micro-batch: its rollouts and padded tensors, and the policy's estimate."""

    edges: Edges
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
    when: Callable[[GRPORunConfig, Edges], bool]
    # The term reads the policy's full next-token distributions.
    full: bool = False


TERMS: Registry[Term] = Registry("loss term")


def loss_term(name: str, when: Callable[[GRPORunConfig, Edges], bool], full: bool = False):
    """Decorator registering ``fn(TermInput) -> TermOutput``; its place in the sum is its
    place in ``plan.TERM_ORDER``."""
    def decorator(fn):
        TERMS.register(name)(Term(fn, when, full))
        return fn
    return decorator


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


def _divergence_of(cfg: GRPORunConfig, edges: Edges):
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
