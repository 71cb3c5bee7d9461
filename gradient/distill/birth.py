"""What a distillation method adds to a step's fresh rollouts at their birth: the teacher's
scores, the method's per-token advantages and keep mask, and, for RSTG, the teacher's solve
rates and SFT rows. Called by ``trainer.step`` before the behaviour log-probs are frozen, so
dropped rollouts cost nothing more and SFT rows are frozen like the others.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from es_llm.backends import BackendSpec, SamplingParams, make_backend
from gradient.loop.batch import Rollout, RolloutBatch
from gradient.distill.methods import DistillInput, method_spec, run_distill
from gradient.distill.rstg import failed_groups, linear_anneal
from gradient.distill.scoring import token_logp
from gradient.maths.logprobs import completion_logits, pad_rows, token_stats
from gradient.loop.seeds import derive_seed


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


def teacher_solve_rates(edges, problems: list, cfg, step: int, cache: dict) -> None:
    """Fill ``cache[problem.id] = (solve rate, shortest correct completion ids or None)`` for
    the problems not in it: RSTG's teacher confidence (mean@k of the teacher's samples) and
    the trajectory of its SFT term."""
    todo = list({p.id: p for p in problems if p.id not in cache}.values())
    if not todo:
        return
    r = cfg.algo.distill.rstg
    # The teacher already loaded for scoring, sampled in the HF decoding loop.
    backend = make_backend(BackendSpec(cfg.algo.distill.teacher, backend="hf", device=cfg.device,
                                       model=edges.teachers["teacher"], tokenizer=edges.tokenizer))
    params = SamplingParams(n=r.teacher_samples, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, max_tokens=cfg.rollout.max_tokens,
                            seed=derive_seed(cfg.seed, "rstg-teacher", step))
    outs = backend.generate([edges.tokenizer(p.prompt).input_ids for p in todo], params)
    scores = iter(edges.task.score_many([(p, c.text) for p, row in zip(todo, outs) for c in row]))
    for p, row in zip(todo, outs):
        correct = [c for c in row if next(scores).correct]
        best = min(correct, key=lambda c: len(c.token_ids)) if correct else None
        cache[p.id] = (len(correct) / len(row), list(best.token_ids) if best else None)


def _sft_rows(fresh: RolloutBatch, failed_B: list[bool], cache: dict, weight: float
              ) -> list[Rollout]:
    """One row per failed group whose teacher solved the prompt: the teacher's shortest
    correct trajectory with advantage ``weight`` on every token (RSTG's SFT term as
    off-policy policy gradient with A = 1, scaled by beta)."""
    out, seen = [], set()
    for r, failed in zip(fresh, failed_B):
        traj = cache.get(r.problem.id, (0.0, None))[1]
        if not failed or traj is None or r.group in seen:
            continue
        seen.add(r.group)
        out.append(replace(r, completion_ids=traj, engine_logp=None, adv=0.0, reward=1.0,
                           old_logp=None, is_weight=None, ref_logp=None,
                           adv_tokens=[weight] * len(traj), sft=True))
    return out


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


def distill_rows(edges, batch: RolloutBatch, cfg, step: int, solve_cache: dict):
    """The method's advantages on the fresh rollouts of ``batch``; returns the rollouts to
    train on (kept ones, then any SFT rows) and the ``distill/*`` metrics."""
    fresh = RolloutBatch.of([r for r in batch if r.adv_tokens is None])
    if not len(fresh):
        return batch, {}
    d = cfg.algo.distill
    spec = method_spec(d.method)
    teacher_B_T, student_B_T, mask_B_T, scorer_metrics = _scores(spec, edges, fresh, cfg)
    T, dev = teacher_B_T.shape[1], teacher_B_T.device
    extra = {}
    if spec.needs_entropy or spec.needs_hidden:
        layer = d.dear.layer if spec.needs_hidden else None
        extra["entropy_B_T"], extra["hidden_B_T_H"] = student_states(
            edges.model, fresh, cfg, edges.tokenizer.pad_token_id, T, layer)
    failed_B = None
    if spec.needs_solve_rate:
        G = cfg.rollout.group_size
        rewards_P_G = torch.tensor([r.reward for r in fresh], device=dev).view(-1, G)
        failed_B = failed_groups(rewards_P_G).repeat_interleave(G)
        teacher_solve_rates(edges, [r.problem for r, f in zip(fresh, failed_B.tolist()) if f],
                            cfg, step, solve_cache)
        extra["failed_B"] = failed_B
        extra["omega_B"] = torch.tensor([solve_cache.get(r.problem.id, (0.0, None))[0]
                                         for r in fresh], device=dev)
    out = run_distill(d.method, DistillInput(
        student_logp_B_T=student_B_T, teacher_logp_B_T=teacher_B_T, mask_B_T=mask_B_T,
        reward_adv_B=torch.tensor([r.adv for r in fresh], device=dev),
        reward_B=torch.tensor([r.reward for r in fresh], device=dev),
        correct_B=torch.tensor([bool(r.correct) for r in fresh], device=dev),
        settings=d, step=step, **extra))
    given = {id(r): replace(r, adv_tokens=out.adv_B_T[i, :len(r.completion_ids)].tolist())
             for i, r in enumerate(fresh)}
    dropped = {id(r) for r, k in zip(fresh, out.keep_B.tolist()) if not k}
    kept = [given.get(id(r), r) for r in batch if id(r) not in dropped]
    tokens = mask_B_T.sum().clamp(min=1)
    metrics = dict(scorer_metrics, **out.metrics)
    if spec.scorer is not None:
        metrics.update({
            "reverse_kl": float(((student_B_T - teacher_B_T) * mask_B_T).sum() / tokens),
            "teacher_logp": float((teacher_B_T * mask_B_T).sum() / tokens)})
    if spec.needs_solve_rate and d.rstg.sft_coef > 0:
        r = d.rstg
        weight = r.sft_coef * linear_anneal(step, r.beta_init, r.beta_decay, r.beta_floor)
        sft = _sft_rows(fresh, failed_B.tolist(), solve_cache, weight)
        kept += sft
        metrics["sft_rows"] = float(len(sft))
    return RolloutBatch.of(kept), {f"distill/{k}": v for k, v in metrics.items()}
