"""How the teacher side of a distillation method sees the student's rollouts (torch glue
around the pure maths of ``opd``, ``w2s`` and ``avsd``).

A scorer gives the teacher's log-probs of the sampled tokens at a rollout's birth
(``MethodSpec.scorer``, run by ``token_logp``); a divergence gives the per-token divergence
of the student's full next-token distributions from the method's target
(``MethodSpec.divergence``, a loss term of ``gradient.loop.loss_terms``). Methods name these
functions themselves, so there is no name to mistype.
``models`` maps a role (teacher, base, positive, negative) to a frozen causal LM; the student
is passed separately since its weights change.
"""

from __future__ import annotations

import torch

from gradient.distill.avsd import avsd_target, jensen_bound_holds
from gradient.distill.opd import generalized_jsd
from gradient.distill.w2s import proxy_reverse_kl, proxy_teacher_logits
from gradient.dllm.estimators import teacher_view_targets
from gradient.maths.logprobs import completion_logits, token_stats


def view_hint(problem, view: str) -> str:
    """The privileged text of an AVSD view: the full reference solution, its first half (by
    characters), or only the final answer (the problem's ``solution``, else its gold)."""
    if view == "answer":
        return str(problem.meta.get("solution") or problem.gold)
    ref = problem.meta["reference"]
    return ref if view == "full" else ref[:len(ref) // 2]


def view_prompt(problem, view: str) -> str:
    """The prompt a view's teacher reads: the hint, then the problem as the student saw it."""
    return f"hint {view_hint(problem, view)}\n{problem.prompt}"


def _full(model, prompts, comps, cfg, pad_id, T):
    with torch.no_grad():
        logp_B_T_V, targets_B_T, mask_B_T, _ = completion_logits(
            model, prompts, comps, T, cfg.rollout.temperature, pad_id)
    return logp_B_T_V, targets_B_T, mask_B_T


def _proxy_logp(models, prompts, comps, cfg, pad_id, T):
    base, targets_B_T, mask_B_T = _full(models["base"], prompts, comps, cfg, pad_id, T)
    pos, _, _ = _full(models["positive"], prompts, comps, cfg, pad_id, T)
    neg, _, _ = _full(models["negative"], prompts, comps, cfg, pad_id, T)
    proxy = proxy_teacher_logits(base, pos, neg, cfg.algo.distill.w2s.alpha)
    return proxy.log_softmax(-1), targets_B_T, mask_B_T


# --- scorers: the teacher's log-probs of the sampled tokens at a rollout's birth -----------
# Each is ``(student, models, rows, cfg, tokenizer, T) -> (logp_B_T, mask_B_T, metrics)`` for
# one chunk of rows; ``token_logp`` runs one over a step's rollouts.

def teacher_scorer(student, models, rows, cfg, tokenizer, T):
    """The teacher model on the student's prompt."""
    full, targets_B_T, mask_B_T = _full(models["teacher"], [r.prompt_ids for r in rows],
                                        [r.completion_ids for r in rows], cfg,
                                        tokenizer.pad_token_id, T)
    return token_stats(full, targets_B_T, mask_B_T, with_entropy=False)[0], mask_B_T, {}


def w2s_scorer(student, models, rows, cfg, tokenizer, T):
    """W2S's proxy teacher base + alpha (positive - negative)."""
    full, targets_B_T, mask_B_T = _proxy_logp(models, [r.prompt_ids for r in rows],
                                              [r.completion_ids for r in rows], cfg,
                                              tokenizer.pad_token_id, T)
    return token_stats(full, targets_B_T, mask_B_T, with_entropy=False)[0], mask_B_T, {}


def views_scorer(student, models, rows, cfg, tokenizer, T):
    """AVSD's bounded consensus target over the privileged views."""
    return _views(student, models, rows, cfg, tokenizer, T)


def _chunks(rows, size):
    for s in range(0, len(rows), size):
        yield rows[s:s + size]


@torch.no_grad()
def token_logp(scorer, student, models: dict, rows, cfg, tokenizer):
    """``(teacher_logp_B_T, mask_B_T, metrics)`` for fresh ``rows`` under ``scorer``, micro-batch
    by micro-batch; metrics are averaged over the micro-batches."""
    T = max(len(r.completion_ids) for r in rows)
    parts = [scorer(student, models, chunk, cfg, tokenizer, T)
             for chunk in _chunks(rows, cfg.micro_batch)]
    metrics = [p[2] for p in parts]
    out = {k: sum(m[k] for m in metrics) / len(metrics) for k in metrics[0]}
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), out


# --- divergences: a full-distribution term of the loss ---------------------------------------
# Each is ``(edges, rows, cfg, logp_B_T_V, mask_B_T) -> div_B_T`` (per-token, with the graph
# of the student's ``logp_B_T_V``).

def teacher_divergence(edges, rows, cfg, logp_B_T_V, mask_B_T):
    """GKD's configured generalized JSD to the teacher, over the vocabulary or its top-K."""
    g = cfg.algo.distill.gjsd
    target_B_T_V, _, _ = _full(edges.teachers["teacher"], [r.prompt_ids for r in rows],
                               [r.completion_ids for r in rows], cfg,
                               edges.tokenizer.pad_token_id, mask_B_T.shape[1])
    return generalized_jsd(logp_B_T_V, target_B_T_V, mask_B_T, g.beta, top_k=g.top_k,
                           tail_bucket=g.tail_bucket)


def w2s_divergence(edges, rows, cfg, logp_B_T_V, mask_B_T):
    """W2S's reverse KL (beta 1) to the proxy teacher over its top-K renormalised (no tail
    bucket, the project's reading of the W2S README)."""
    target_B_T_V, _, _ = _proxy_logp(edges.teachers, [r.prompt_ids for r in rows],
                                     [r.completion_ids for r in rows], cfg,
                                     edges.tokenizer.pad_token_id, mask_B_T.shape[1])
    return proxy_reverse_kl(logp_B_T_V, target_B_T_V, mask_B_T, cfg.algo.distill.w2s.top_k)


def self_view_divergence(edges, rows, cfg, logp_B_T_V, mask_B_T):
    """dOPSD: the generalized JSD to the same model (or the fixed initial student) on a later
    state of the rollout's own trajectory (``dllm.estimators.teacher_view_targets``)."""
    d = cfg.algo.distill.dopsd
    teacher = edges.teachers["base"] if d.fixed_teacher else edges.model
    target_B_T_V = teacher_view_targets(teacher, rows, mask_B_T.shape[1],
                                        cfg.rollout.temperature, edges.tokenizer.pad_token_id,
                                        edges.tokenizer.mask_token_id, d)
    return generalized_jsd(logp_B_T_V, target_B_T_V, mask_B_T, d.beta)


def _candidates(view_M_B_T_V, targets_B_T, top_k):
    """Candidate ids ``(B, T, C)`` (each view's top-K and the sampled token) and a mask of
    the first occurrence of each id, so a token in several top-Ks counts once."""
    M, B, T, V = view_M_B_T_V.shape
    k = min(top_k, V)
    top = view_M_B_T_V.topk(k, dim=-1).indices.permute(1, 2, 0, 3).reshape(B, T, M * k)
    # The sampled token goes first, so (stable sort) it is the occurrence that stays.
    ids_B_T_C = torch.cat([targets_B_T[..., None], top], dim=-1)
    ids_sorted, order = ids_B_T_C.sort(dim=-1, stable=True)
    first = torch.ones_like(ids_sorted, dtype=torch.bool)
    first[..., 1:] = ids_sorted[..., 1:] != ids_sorted[..., :-1]
    support_B_T_C = torch.empty_like(first).scatter_(-1, order, first)
    return ids_B_T_C, support_B_T_C


def _views(student, models, rows, cfg, tokenizer, T):
    """AVSD's bounded consensus target at the sampled tokens, for one chunk of rows."""
    a, pad_id = cfg.algo.distill.avsd, tokenizer.pad_token_id
    teacher = student if a.live else models["base"]
    comps = [r.completion_ids for r in rows]
    student_V, targets_B_T, mask_B_T = _full(student, [r.prompt_ids for r in rows], comps,
                                             cfg, pad_id, T)
    views = []
    for view in a.views:
        prompts = [tokenizer(view_prompt(r.problem, view)).input_ids for r in rows]
        views.append(_full(teacher, prompts, comps, cfg, pad_id, T)[0])
    view_M_B_T_V = torch.stack(views)
    ids_B_T_C, support_B_T_C = _candidates(view_M_B_T_V, targets_B_T, a.top_k)
    M = view_M_B_T_V.shape[0]
    view_M_B_T_C = view_M_B_T_V.gather(-1, ids_B_T_C[None].expand(M, -1, -1, -1))
    parts = avsd_target(view_M_B_T_C, student_V.gather(-1, ids_B_T_C), support_B_T_C, mask_B_T)
    logp_B_T = parts["target"][..., 0] * mask_B_T
    tokens = mask_B_T.sum().clamp(min=1)
    metrics = {"gate_mean": float((parts["gate"].sum(-1) / support_B_T_C.sum(-1)
                                   * mask_B_T).sum() / tokens),
               "residual_mean": float((parts["residual"][..., 0] * mask_B_T).sum() / tokens),
               "bound_holds": float(jensen_bound_holds(parts))}
    return logp_B_T, mask_B_T, metrics
