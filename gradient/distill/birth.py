"""What a distillation method adds to a step's fresh rollouts at their birth: the teacher's
scores, what else the method's spec asks for, the method's per-token advantages and keep
mask, and any rows the method adds. Run by the ``distill`` birth stage before the behaviour
log-probs are frozen, so dropped rollouts cost nothing more and added rows are frozen like
the others. It names no method: each one's needs are declarations of its ``MethodSpec``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gradient.distill.methods import DistillInput, method_spec, run_distill
from gradient.distill.scoring import token_logp
from gradient.loop.batch import RolloutBatch
from gradient.maths.logprobs import completion_logits, pad_rows, token_stats


@torch.no_grad()
def student_states(model, rows, cfg, pad_id, T, hidden_layer):
    """The student's entropy (and a layer's hidden states) at each generated position."""
    ents, hiddens = [], []
    for s in range(0, len(rows), cfg.micro_batch):
        chunk = rows[s:s + cfg.micro_batch]
        logp_B_T_V, targets_B_T, mask_B_T, hidden_B_T_H = completion_logits(
            model, [r.prompt_ids for r in chunk], [r.completion_ids for r in chunk], T,
            cfg.rollout.temperature, pad_id, hidden_layer)
        ents.append(token_stats(logp_B_T_V, targets_B_T, mask_B_T)[1])
        hiddens.append(hidden_B_T_H)
    return torch.cat(ents), (torch.cat(hiddens) if hidden_layer is not None else None)


def _scores(spec, edges, fresh: RolloutBatch, cfg):
    """``(teacher_B_T, student_B_T, mask_B_T, metrics)`` of the method's scorer (zeros when
    it has none: its signal is the divergence term alone)."""
    if spec.scorer is None:
        T = max(len(r.completion_ids) for r in fresh)
        mask_B_T = pad_rows([[1.0] * len(r.completion_ids) for r in fresh], T, "cpu")
        zeros_B_T = torch.zeros_like(mask_B_T)
        return zeros_B_T, zeros_B_T, mask_B_T, {}
    teacher_B_T, mask_B_T, metrics = token_logp(spec.scorer, edges.model, edges.teachers, fresh,
                                                cfg, edges.tokenizer)
    student_B_T = pad_rows([r.engine_logp for r in fresh], teacher_B_T.shape[1],
                           teacher_B_T.device)
    return teacher_B_T, student_B_T, mask_B_T, metrics


def distill_rows(edges, batch: RolloutBatch, cfg, step: int, memo: dict):
    """The method's advantages on the fresh rollouts of ``batch`` (those whose advantage is
    still the sequence's); returns the rollouts to train on (kept ones, then any rows the
    method adds) and the ``distill/*`` metrics. ``memo`` is what the run keeps for the method
    from step to step."""
    fresh = RolloutBatch.of([r for r in batch if not r.per_token()])
    if not len(fresh):
        return batch, {}
    d = cfg.algo.distill
    spec = method_spec(d.method)
    teacher_B_T, student_B_T, mask_B_T, scorer_metrics = _scores(spec, edges, fresh, cfg)
    T, dev = teacher_B_T.shape[1], teacher_B_T.device
    extra = {}
    if spec.needs_entropy or spec.hidden_layer is not None:
        layer = spec.hidden_layer(d) if spec.hidden_layer is not None else None
        extra["entropy_B_T"], extra["hidden_B_T_H"] = student_states(
            edges.model, fresh, cfg, edges.tokenizer.pad_token_id, T, layer)
    if spec.birth_inputs is not None:
        extra.update(spec.birth_inputs(edges, fresh, cfg, step, memo, dev))
    out = run_distill(d.method, DistillInput(
        student_logp_B_T=student_B_T, teacher_logp_B_T=teacher_B_T, mask_B_T=mask_B_T,
        reward_adv_B=torch.tensor([r.adv for r in fresh], device=dev),
        reward_B=torch.tensor([r.reward for r in fresh], device=dev),
        correct_B=torch.tensor([bool(r.correct) for r in fresh], device=dev),
        settings=d, step=step, **extra))
    given = {id(r): replace(r, adv=out.adv_B_T[i, :len(r.completion_ids)].tolist())
             for i, r in enumerate(fresh)}
    dropped = {id(r) for r, k in zip(fresh, out.keep_B.tolist()) if not k}
    kept = [given.get(id(r), r) for r in batch if id(r) not in dropped]
    tokens = mask_B_T.sum().clamp(min=1)
    metrics = dict(scorer_metrics, **out.metrics)
    if spec.scorer is not None:
        metrics.update({
            "reverse_kl": float(((student_B_T - teacher_B_T) * mask_B_T).sum() / tokens),
            "teacher_logp": float((teacher_B_T * mask_B_T).sum() / tokens)})
    if spec.extra_rows is not None:
        rows, m = spec.extra_rows(fresh, extra, cfg, step, memo)
        kept += rows
        metrics.update(m)
    return RolloutBatch.of(kept), {f"distill/{k}": v for k, v in metrics.items()}
