"""On-policy distillation: the sampled-token reverse-KL advantage and TRL's generalized JSD.

Two estimators of the same goal (make the student match the teacher on the student's own
rollouts), with different gradients:

- ``reverse_kl_advantage``: the Thinking Machines / Tinker form. The per-token advantage is
  ``-(log pi_S(o_t) - log pi_T(o_t))`` on the sampled token, fed to the ordinary policy loss;
  its policy gradient is the REINFORCE estimator of the per-token reverse KL. Needs only the
  teacher's log-prob of the sampled token.
- ``generalized_jsd``: TRL's GKD divergence, an exact sum over the vocabulary (or the teacher's
  top-K) at each visited prefix. Its gradient ignores how the student changes which prefixes
  are visited.

Masking: every output is exactly 0 where ``mask_B_T`` is 0, and the values sitting there
(padding, prompt tokens, even NaN) change neither the output nor its gradient.
"""

from __future__ import annotations

import math

import torch

from populations.numbers import is_finite_number


def check_b_t(mask_B_T: torch.Tensor, **tensors_B_T: torch.Tensor) -> torch.Tensor:
    """Validate ``(B, T)`` tensors against ``mask_B_T``; return the mask as bool.

    Raises ValueError unless the mask is 2-D and every named tensor is floating with its shape.
    """
    if not isinstance(mask_B_T, torch.Tensor) or mask_B_T.dim() != 2:
        raise ValueError(f"mask_B_T must be a 2-D tensor (rows x tokens), got "
                         f"{type(mask_B_T).__name__} of shape {getattr(mask_B_T, 'shape', None)}")
    for name, x in tensors_B_T.items():
        if not (isinstance(x, torch.Tensor) and x.dtype.is_floating_point):
            raise ValueError(f"{name} must be a floating tensor")
        if x.shape != mask_B_T.shape:
            raise ValueError(f"{name} {tuple(x.shape)} must have mask_B_T's shape "
                             f"{tuple(mask_B_T.shape)}")
    return mask_B_T.bool()


def check_number(name: str, x, lo: float = -math.inf, hi: float = math.inf) -> None:
    """ValueError unless ``x`` is a finite real number in ``[lo, hi]`` (bools rejected)."""
    if not (is_finite_number(x) and lo <= x <= hi):
        raise ValueError(f"{name} must be a finite number in [{lo}, {hi}], got {x!r}")


def row_max_normalised(x_B_T: torch.Tensor, keep_B_T: torch.Tensor) -> torch.Tensor:
    """``x_B_T / max_row(x)``, shape ``(B, T)``, the max over each row's kept entries.

    ``x_B_T`` must be non-negative (entropies, absolute divergences); ``keep_B_T`` is a bool
    mask. Kept entries land in [0, 1]; a row whose maximum is 0 and every masked entry give 0.
    Used by the token-selection scores of RSTG and DEAR.
    """
    zero = torch.zeros((), dtype=x_B_T.dtype, device=x_B_T.device)
    x = torch.where(keep_B_T, x_B_T, zero)
    top_B_1 = x.amax(dim=1, keepdim=True)
    return torch.where(top_B_1 > 0, x / torch.where(top_B_1 > 0, top_B_1, 1.0), zero)


def reverse_kl_advantage(student_logp_B_T: torch.Tensor, teacher_logp_B_T: torch.Tensor,
                         mask_B_T: torch.Tensor) -> torch.Tensor:
    """Per-token OPD advantage ``-(log pi_S(o_t) - log pi_T(o_t))``, detached, shape ``(B, T)``.

    Thinking Machines "On-Policy Distillation" (2025; tinker_cookbook
    ``distillation/train_on_policy.py``), also TRL SDFT ``sampled_token``, RSTG and RA-OPD.
    ``student_logp_B_T`` is the log-prob of each sampled token under the policy that sampled
    it (Tinker uses the sampler's log-prob; the trainer may pass the behaviour log-probs
    ``old_logp_B_T``), ``teacher_logp_B_T`` the teacher's log-prob of the same token given the
    same prefix. The advantage is positive where the teacher finds the token more likely.
    Exactly 0 at masked positions. Feed it as ``LossInput.adv_B_T`` (or first through
    ``combine_with_reward``).

    Departure: Tinker's coefficient ``c_KL`` and optional discounted future sum
    (``kl_discount_factor``, default 0) are not here; ``combine_with_reward`` applies the
    coefficient, and the discount is left out (Tinker's default, gamma = 0).
    """
    keep_B_T = check_b_t(mask_B_T, student_logp_B_T=student_logp_B_T,
                         teacher_logp_B_T=teacher_logp_B_T)
    s = student_logp_B_T.detach()
    t = teacher_logp_B_T.detach().to(s.dtype)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    return torch.where(keep_B_T, torch.where(keep_B_T, t, zero) - torch.where(keep_B_T, s, zero),
                       zero)


def combine_with_reward(adv_kl_B_T: torch.Tensor, reward_adv_B: torch.Tensor,
                        mask_B_T: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """``A_t = reward_adv_b + kl_coef * adv_kl_t`` on every generated token, detached, ``(B, T)``.

    The Tinker form (tinker_cookbook ``distillation/train_on_policy.py``): the distillation
    advantage ``-c_KL * (log q - log pi_T)`` is *added* to the environment advantage, which is
    the group-centred reward ``r_i - mean_g r`` with no std scaling (``gradient.maths.advantages``
    estimator ``dr_grpo``; ``reward_adv_B`` is its ``adv_P_G`` flattened to rows). For pure
    distillation pass zeros. ``kl_coef`` is ``c_KL`` (Tinker default 1). Exactly 0 at masked
    positions. Any advantage estimator's output may be passed; the Tinker form is the
    ``dr_grpo`` one.
    """
    keep_B_T = check_b_t(mask_B_T, adv_kl_B_T=adv_kl_B_T)
    check_number("kl_coef", kl_coef, 0.0)
    if not (isinstance(reward_adv_B, torch.Tensor) and reward_adv_B.shape == keep_B_T.shape[:1]):
        raise ValueError(f"reward_adv_B must have shape ({keep_B_T.shape[0]},), got "
                         f"{tuple(getattr(reward_adv_B, 'shape', ()))}")
    a = adv_kl_B_T.detach()
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    reward_B_1 = reward_adv_B.detach().to(a.dtype)[:, None]
    total_B_T = reward_B_1 + kl_coef * torch.where(keep_B_T, a, zero)
    return torch.where(keep_B_T, total_B_T, zero)


def _categories(student_lp: torch.Tensor, teacher_lp: torch.Tensor, teacher_logits: torch.Tensor,
                top_k: int | None, tail_bucket: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of both models over the categories the divergence sums over: the whole
    vocabulary, the teacher's top-K renormalised, or the top-K plus one tail category."""
    V = student_lp.shape[-1]
    if top_k is None or top_k >= V:
        return student_lp, teacher_lp
    idx = teacher_logits.topk(top_k, dim=-1).indices
    s_K, t_K = student_lp.gather(-1, idx), teacher_lp.gather(-1, idx)
    if not tail_bucket:
        return s_K.log_softmax(-1), t_K.log_softmax(-1)
    # The tail is the log-sum-exp of the entries outside the top-K (no 1 - sum cancellation).
    outside = torch.ones_like(student_lp, dtype=torch.bool).scatter(-1, idx, False)
    ninf = torch.full((), -math.inf, dtype=student_lp.dtype, device=student_lp.device)
    s_tail = torch.where(outside, student_lp, ninf).logsumexp(-1, keepdim=True)
    t_tail = torch.where(outside, teacher_lp, ninf).logsumexp(-1, keepdim=True)
    return torch.cat([s_K, s_tail], -1), torch.cat([t_K, t_tail], -1)


def _kl(p_lp: torch.Tensor, q_lp: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_c p_c (log p_c - log q_c)`` over the last dimension."""
    return (p_lp.exp() * (p_lp - q_lp)).sum(-1)


def generalized_jsd(student_logits_B_T_V: torch.Tensor, teacher_logits_B_T_V: torch.Tensor,
                    mask_B_T: torch.Tensor, beta: float, *, temperature: float = 1.0,
                    top_k: int | None = None, tail_bucket: bool = True) -> torch.Tensor:
    """TRL's generalized Jensen-Shannon divergence per token, ``loss_B_T`` (to be minimised).

    Agarwal et al. 2024, GKD (arXiv 2306.13649); TRL ``GKDTrainer.generalized_jsd_loss``.
    With S = softmax(student / temperature), T = softmax(teacher / temperature) and the mixture
    M = (1 - beta) S + beta T:

        JSD_beta = beta * KL(T || M) + (1 - beta) * KL(S || M)    for 0 < beta < 1,
        beta = 0: KL(T || S)  (forward, mode-covering),
        beta = 1: KL(S || T)  (reverse, mode-seeking),

    the endpoints computed exactly as TRL does. Note that the endpoints are TRL's definitions,
    not limits of the formula: as beta -> 0 the formula tends to 0 like ``beta * KL(T || S)``,
    and as beta -> 1 like ``(1 - beta) * KL(S || T)``.

    Support: ``top_k=None`` sums over the whole vocabulary. With ``top_k = K`` the categories
    are the teacher's K most likely tokens at each position (ties as ``torch.topk``); with
    ``tail_bucket`` one extra category holds each model's remaining mass, so both
    distributions still sum to 1 and are not distorted; without it both are renormalised over
    the K tokens. ``K >= V`` is the full vocabulary (the tail is empty).

    ``student_logits_B_T_V`` carries the graph; ``teacher_logits_B_T_V`` is detached (frozen
    teacher). Logits at masked positions are replaced by zeros before any arithmetic, so they
    never matter; the loss there is exactly 0. Logits must otherwise be finite. The
    arithmetic is in the student's dtype promoted to at least float32. Reduction is the
    caller's (``gradient.maths.aggregation``; TRL divides the sum by the token count).

    Departure: no ``lmbda`` data schedule or teacher-generated sequences (the trainer decides
    where rollouts come from); the gradient is the exact-divergence one TRL uses, without a
    score-function term for the visited prefixes.
    """
    if not (isinstance(student_logits_B_T_V, torch.Tensor)
            and isinstance(teacher_logits_B_T_V, torch.Tensor)
            and student_logits_B_T_V.dim() == 3
            and student_logits_B_T_V.shape == teacher_logits_B_T_V.shape
            and student_logits_B_T_V.dtype.is_floating_point
            and teacher_logits_B_T_V.dtype.is_floating_point):
        raise ValueError("student_logits_B_T_V and teacher_logits_B_T_V must be floating "
                         "(B, T, V) tensors of the same shape")
    if not isinstance(mask_B_T, torch.Tensor) or mask_B_T.shape != student_logits_B_T_V.shape[:2]:
        raise ValueError(f"mask_B_T must have shape {tuple(student_logits_B_T_V.shape[:2])}")
    check_number("beta", beta, 0.0, 1.0)
    check_number("temperature", temperature, 0.0)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool)
                                  and top_k >= 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    keep_B_T = mask_B_T.bool()
    dtype = torch.promote_types(student_logits_B_T_V.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=student_logits_B_T_V.device)
    keep = keep_B_T[..., None]
    s_logits = torch.where(keep, student_logits_B_T_V.to(dtype), zero) / temperature
    t_logits = torch.where(keep, teacher_logits_B_T_V.detach().to(dtype), zero) / temperature
    s_lp, t_lp = _categories(s_logits.log_softmax(-1), t_logits.log_softmax(-1), t_logits,
                             top_k, tail_bucket)
    if beta == 0:
        loss_B_T = _kl(t_lp, s_lp)
    elif beta == 1:
        loss_B_T = _kl(s_lp, t_lp)
    else:
        m_lp = torch.logaddexp(s_lp + math.log(1 - beta), t_lp + math.log(beta))
        loss_B_T = beta * _kl(t_lp, m_lp) + (1 - beta) * _kl(s_lp, m_lp)
    return torch.where(keep_B_T, loss_B_T, zero)
