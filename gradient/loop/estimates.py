"""The policy's log-probs of a batch of rollouts through the run's registered estimator
(``algo.dllm.estimator``): the estimate a loss term reads, and the frozen behaviour and
reference log-probs a birth stage keeps."""

from __future__ import annotations

import torch

from gradient.config import GRPORunConfig
from gradient.dllm.estimators import EstimateInput, estimate, estimator_spec
from gradient.loop.batch import RolloutBatch
from gradient.loop.state import Edges


def views(cfg: GRPORunConfig) -> list[int]:
    """The mask views whose log-probs are frozen: one per inner iteration (epoch) for an
    estimator whose masks change with it, else one."""
    return list(range(cfg.algo.epochs)) if estimator_spec(cfg.algo.dllm.estimator).per_view \
        else [0]


def estimate_input(edges: Edges, model, rows, cfg: GRPORunConfig, view: int = 0,
                   full: bool = False, with_entropy: bool = True) -> EstimateInput:
    a = cfg.algo
    return EstimateInput(
        model=model, rows=tuple(rows), temperature=cfg.rollout.temperature,
        pad_id=edges.tokenizer.pad_token_id, mask_id=edges.tokenizer.mask_token_id,
        settings=a.dllm, block_length=edges.block_length, view=view, full=full,
        with_entropy=with_entropy, dopsd=a.distill.dopsd)


def policy_estimate(edges: Edges, model, rows, cfg: GRPORunConfig, view: int = 0,
                    full: bool = False, with_entropy: bool = True):
    return estimate(cfg.algo.dllm.estimator,
                    estimate_input(edges, model, rows, cfg, view, full, with_entropy))


@torch.no_grad()
def frozen_logp(edges: Edges, model, batch: RolloutBatch, cfg: GRPORunConfig, view: int):
    """``(logp_B_T, mask_B_T)`` of ``batch`` under a model, micro-batch by micro-batch."""
    T = max(len(r.completion_ids) for r in batch)
    parts = [policy_estimate(edges, model, batch[s:s + cfg.micro_batch], cfg, view,
                             with_entropy=False) for s in range(0, len(batch), cfg.micro_batch)]
    logp_B_T = torch.cat([_pad_to(p.logp_B_T, T) for p in parts])
    return logp_B_T, torch.cat([_pad_to(p.mask_B_T, T) for p in parts])


def _pad_to(x_B_T: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(x_B_T, (0, T - x_B_T.shape[1]))
