"""W2S-OPD: distil from a proxy teacher built by contrasting two weak models.

arXiv 2607.26246, Weak-to-Strong On-Policy Distillation (code README: Yu-Fangxu/W2S-OPD). At
every position of a student rollout the teacher is

    softmax(z_proxy),  z_proxy = z_base + alpha * (z_+ - z_-),

with z_base the frozen initial student and z_+ / z_- the stronger / weaker of a contrast pair
(post-RL expert vs its initial checkpoint, larger vs smaller base, or one base given a
correct vs an incorrect hint). The loss is the per-position reverse KL on the proxy's top-K.
All three models must share the student's tokenizer (the same V).
"""

from __future__ import annotations

import torch

from gradient.distill.opd import check_number, generalized_jsd


def proxy_teacher_logits(base_logits_B_T_V: torch.Tensor, pos_logits_B_T_V: torch.Tensor,
                         neg_logits_B_T_V: torch.Tensor, alpha: float) -> torch.Tensor:
    """``z_base + alpha * (z_+ - z_-)``, detached, shape ``(B, T, V)``.

    arXiv 2607.26246 (the README's ``PROXY_ALPHA``; a reproduction found alpha in 0.5-2
    insensitive). Logits, not log-probs, are combined, as the paper writes; since log-softmax
    only shifts each position by a constant, passing log-probs gives the same teacher.
    Arithmetic in the base logits' dtype promoted to at least float32.
    """
    x = (base_logits_B_T_V, pos_logits_B_T_V, neg_logits_B_T_V)
    if not (all(isinstance(z, torch.Tensor) and z.dtype.is_floating_point for z in x)
            and base_logits_B_T_V.dim() == 3
            and base_logits_B_T_V.shape == pos_logits_B_T_V.shape == neg_logits_B_T_V.shape):
        raise ValueError("base, pos and neg logits must be floating (B, T, V) tensors of one "
                         "shape (the three models must share a vocabulary)")
    check_number("alpha", alpha)
    dtype = torch.promote_types(base_logits_B_T_V.dtype, torch.float32)
    base, pos, neg = (z.detach().to(dtype) for z in x)
    return base + alpha * (pos - neg)


def proxy_reverse_kl(student_logits_B_T_V: torch.Tensor, proxy_logits_B_T_V: torch.Tensor,
                     mask_B_T: torch.Tensor, top_k: int | None, *,
                     tail_bucket: bool = False, temperature: float = 1.0) -> torch.Tensor:
    """Per-token reverse KL(student || softmax(proxy)) over the proxy's top-K, ``loss_B_T``.

    arXiv 2607.26246 (``MODE=reverse``, ``TOPK``; top-32 in a reproduction). This is
    ``opd.generalized_jsd`` with beta = 1 and the proxy as the teacher, so masking, detachment
    of the proxy and the gradient are as there.

    Project's reading (the README does not say how the two distributions are restricted to
    the top-K): by default both are renormalised over the proxy's K tokens
    (``tail_bucket=False``); ``tail_bucket=True`` keeps the rest of each distribution's mass
    in one extra category instead. ``top_k=None`` is the full vocabulary.
    """
    return generalized_jsd(student_logits_B_T_V, proxy_logits_B_T_V, mask_B_T, 1.0,
                           temperature=temperature, top_k=top_k, tail_bucket=tail_bucket)
