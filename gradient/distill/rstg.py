"""RSTG: distil where the student fails, on the tokens that matter.

Han et al. 2026, "Distill Where You Fail" (arXiv 2608.00782), Eqs. 9-13. OPD runs only on
negative zero-variance groups (every rollout of the prompt failed); every other group keeps
plain GRPO. Inside a failed group the OPD advantage is weighted by the teacher's confidence
and an annealed coefficient, and applied only on the top-k% tokens by a soft-OR of the
student's entropy and the teacher-student divergence. The auxiliary SFT term (Eq. 14, NLL on
a teacher trajectory) is an ordinary loss on other data: extra rows of the step.

The last part is RSTG's torch glue at a rollout's birth, which its spec in ``methods`` names:
the teacher's solve rates (``solve_rate_inputs``) and the SFT rows (``sft_rows``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from gradient.distill.opd import check_b_t, check_number, row_max_normalised
from gradient.loop.batch import Rollout, RolloutBatch
from gradient.loop.seeds import derive_seed


def failed_groups(rewards_P_G: torch.Tensor, fail_reward: float = 0.0) -> torch.Tensor:
    """``failed_P`` (bool): no rollout of the prompt scored above ``fail_reward``.

    arXiv 2608.00782's gate "all r_j = 0" for 0/1 rewards; ``fail_reward`` names the failure
    value of other reward scales. Broadcast to rows with ``failed_P.repeat_interleave(G)``.
    """
    if not (isinstance(rewards_P_G, torch.Tensor) and rewards_P_G.dim() == 2):
        raise ValueError("rewards_P_G must be a 2-D tensor (prompts x rollouts)")
    check_number("fail_reward", fail_reward)
    return (rewards_P_G.detach() <= fail_reward).all(dim=1)


def linear_anneal(step: int, init: float, decay: float, floor: float) -> float:
    """``max(init - decay * step, floor)``: RSTG's beta schedule (paper: init 5e-3, decay
    5e-5 per step, floor 1e-3), a plain float for the trainer to pass on."""
    for name, x in (("init", init), ("decay", decay), ("floor", floor)):
        check_number(name, x)
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return max(init - decay * step, floor)


def soft_or_scores(entropy_B_T: torch.Tensor, adv_opd_B_T: torch.Tensor,
                   mask_B_T: torch.Tensor) -> torch.Tensor:
    """Token scores ``s = h + d - h * d`` in [0, 1], detached, shape ``(B, T)``; 0 where masked.

    arXiv 2608.00782 Eqs. 10-12 (TIP-inspired): ``h`` is the normalised student entropy at the
    position, ``d`` the normalised divergence ``|A^OPD_t| = |log pi_T - log pi_S|``. The
    soft-OR is high when either is high.

    Project's reading (the normalisation is not given): each is divided by its maximum over
    the row's masked tokens, so both lie in [0, 1] and the score is scale-free; a row whose
    maximum is 0 gives 0 for that term. ``entropy_B_T`` must be >= 0 (the student's
    full-vocabulary entropy, computed by the trainer from its logits).
    """
    keep_B_T = check_b_t(mask_B_T, entropy_B_T=entropy_B_T, adv_opd_B_T=adv_opd_B_T)
    dtype = torch.promote_types(entropy_B_T.dtype, torch.float32)
    h = row_max_normalised(entropy_B_T.detach().to(dtype), keep_B_T)
    zero = torch.zeros((), dtype=dtype, device=h.device)
    d = row_max_normalised(torch.where(keep_B_T, adv_opd_B_T.detach().to(dtype), zero).abs(),
                            keep_B_T)
    return torch.where(keep_B_T, h + d - h * d, zero)


def top_fraction(score_B_T: torch.Tensor, mask_B_T: torch.Tensor, frac: float) -> torch.Tensor:
    """``select_B_T`` (bool): in each row, the ``ceil(frac * n_b)`` masked tokens of highest
    score, n_b the row's masked-token count. arXiv 2608.00782 Eq. 13 ("top-k% tokens").

    Project's reading: the selection is per rollout. Ties are broken towards earlier
    positions (stable sort). ``frac`` in [0, 1]; 1 keeps every masked token.
    """
    keep_B_T = check_b_t(mask_B_T, score_B_T=score_B_T)
    check_number("frac", frac, 0.0, 1.0)
    ninf = torch.full((), -math.inf, dtype=score_B_T.dtype, device=score_B_T.device)
    s = torch.where(keep_B_T, score_B_T.detach(), ninf)
    order_B_T = s.sort(dim=1, descending=True, stable=True).indices
    rank_B_T = torch.empty_like(order_B_T).scatter_(
        1, order_B_T, torch.arange(s.shape[1], device=s.device).expand_as(order_B_T))
    k_B_1 = torch.ceil(keep_B_T.sum(1, keepdim=True).to(torch.float64) * frac).long()
    return keep_B_T & (rank_B_T < k_B_1)


def hybrid_advantage(grpo_adv_B: torch.Tensor, adv_opd_B_T: torch.Tensor, failed_B: torch.Tensor,
                     omega_B: torch.Tensor, beta: float, select_B_T: torch.Tensor,
                     mask_B_T: torch.Tensor) -> torch.Tensor:
    """RSTG's hybrid advantage (arXiv 2608.00782 Eq. 9), detached, shape ``(B, T)``:

        A_t = beta * omega_b * A^OPD_t * select_t    if row b's group failed entirely,
        A_t = A^GRPO_b                               otherwise,

    0 at masked positions. ``grpo_adv_B``: the group advantage of each row (any estimator of
    ``gradient.maths.advantages``; in a failed group it is 0 anyway); ``adv_opd_B_T``:
    ``opd.reverse_kl_advantage``; ``failed_B``: ``failed_groups`` broadcast to rows;
    ``omega_B`` in [0, 1]: the teacher's precomputed solve rate (paper: mean@8) on the row's
    prompt; ``beta``: ``linear_anneal``'s value this step; ``select_B_T``: ``top_fraction``
    of ``soft_or_scores`` (all ones to skip token selection).
    """
    keep_B_T = check_b_t(mask_B_T, adv_opd_B_T=adv_opd_B_T)
    check_number("beta", beta, 0.0)
    B = keep_B_T.shape[0]
    for name, x in (("grpo_adv_B", grpo_adv_B), ("failed_B", failed_B), ("omega_B", omega_B)):
        if not (isinstance(x, torch.Tensor) and x.shape == (B,)):
            raise ValueError(f"{name} must have shape ({B},)")
    if not (isinstance(select_B_T, torch.Tensor) and select_B_T.shape == keep_B_T.shape):
        raise ValueError(f"select_B_T must have shape {tuple(keep_B_T.shape)}")
    a = adv_opd_B_T.detach()
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    on_B_T = keep_B_T & select_B_T.bool()
    opd_B_T = beta * omega_B.detach().to(a.dtype)[:, None] * torch.where(on_B_T, a, zero)
    grpo_B_T = grpo_adv_B.detach().to(a.dtype)[:, None].expand_as(a)
    return torch.where(keep_B_T, torch.where(failed_B.bool()[:, None], opd_B_T, grpo_B_T), zero)


# --- at a rollout's birth: what RSTG's spec asks the trainer for ----------------------------

def teacher_solve_rates(edges, problems: list, cfg, step: int, memo: dict) -> None:
    """Fill ``memo[problem.id] = (solve rate, shortest correct completion ids or None)`` for
    the problems not in it: RSTG's teacher confidence (mean@k of the teacher's samples) and
    the trajectory of its SFT term."""
    from es_llm.backends import BackendSpec, SamplingParams, make_backend

    todo = list({p.id: p for p in problems if p.id not in memo}.values())
    if not todo:
        return
    r = cfg.algo.distill.rstg
    # The teacher already loaded for scoring, sampled in the HF decoding loop.
    backend = make_backend(BackendSpec(cfg.algo.distill.teacher, backend="hf",
                                       runtime=cfg.runtime, model=edges.teachers["teacher"],
                                       tokenizer=edges.tokenizer))
    params = SamplingParams(n=r.teacher_samples, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, max_tokens=cfg.rollout.max_tokens,
                            seed=derive_seed(cfg.seed, "rstg-teacher", step))
    outs = backend.generate([edges.tokenizer(p.prompt).input_ids for p in todo], params)
    scores = iter(edges.task.score_many([(p, c.text) for p, row in zip(todo, outs) for c in row]))
    for p, row in zip(todo, outs):
        correct = [c for c in row if next(scores).correct]
        best = min(correct, key=lambda c: len(c.token_ids)) if correct else None
        memo[p.id] = (len(correct) / len(row), list(best.token_ids) if best else None)


def solve_rate_inputs(edges, fresh: RolloutBatch, cfg, step: int, memo: dict, device) -> dict:
    """RSTG's ``DistillInput`` fields beyond the scores: whether each rollout's group failed
    entirely (``failed_B``) and the teacher's solve rate on its prompt (``omega_B``); the
    teacher samples each failed problem once, kept in ``memo``."""
    G = cfg.rollout.group_size
    rewards_P_G = torch.tensor([r.reward for r in fresh], device=device).view(-1, G)
    failed_B = failed_groups(rewards_P_G).repeat_interleave(G)
    teacher_solve_rates(edges, [r.problem for r, f in zip(fresh, failed_B.tolist()) if f], cfg,
                        step, memo)
    return {"failed_B": failed_B,
            "omega_B": torch.tensor([memo.get(r.problem.id, (0.0, None))[0] for r in fresh],
                                    device=device)}


def sft_rows(fresh: RolloutBatch, inputs: dict, cfg, step: int, memo: dict
             ) -> tuple[list[Rollout], dict]:
    """RSTG's SFT term as extra rows (none when ``sft_coef`` is 0): one per failed group whose
    teacher solved the prompt, the teacher's shortest correct trajectory with advantage
    ``sft_coef * beta`` on every token (off-policy policy gradient with A = 1, scaled)."""
    r = cfg.algo.distill.rstg
    if not r.sft_coef > 0:
        return [], {}
    weight = r.sft_coef * linear_anneal(step, r.beta_init, r.beta_decay, r.beta_floor)
    out, seen = [], set()
    for row, failed in zip(fresh, inputs["failed_B"].tolist()):
        traj = memo.get(row.problem.id, (0.0, None))[1]
        if not failed or traj is None or row.group in seen:
            continue
        seen.add(row.group)
        out.append(replace(row, completion_ids=traj, engine_logp=None, reward=1.0,
                           old_logp=None, is_weight=None, ref_logp=None,
                           adv=[weight] * len(traj)))
    return out, {"sft_rows": float(len(out))}
