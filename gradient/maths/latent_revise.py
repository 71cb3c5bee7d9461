"""LatentRevise: revise a failed rollout's reasoning prefix in embedding space until it points
at the gold answer, then let the frozen model continue from it.

LatentRevise (Guo, Han, Jia, Zhai, Bai; arXiv 2606.29938) targets zero-hit prompts, where no
rollout succeeds and RLVR gets no signal. For a failed rollout it optimises the input
embeddings of the rollout's reasoning prefix with two gradients, away from the failed
continuation and toward the gold answer, keeping each position inside the convex hull of the
vocabulary embeddings so that every update moves toward a real token embedding; the policy
stays frozen. Continuations from the revised prefix reach answers the rollouts missed and
serve as training data. No code is public; a secondary summary reports about 10 Frank-Wolfe
steps per failed rollout. The reading here:

* **Parameters.** Each prefix position t is a point ``w_t`` on the probability simplex over
  the vocabulary; its input embedding is ``w_t @ E`` (E the model's input embedding matrix,
  ``(V, D)``). Start: the one-hot of the rollout's own token, where the model's logits are
  exactly those of the original tokens (tested).
* **Loss.** ``L(w) = -log p(gold | prompt, w) + lambda * away(log p(fail | prompt, w))``:
  the gold continuation's summed token log-likelihood and a term of the failed
  continuation's (what the rollout wrote after the prefix), ``lambda >= 0``. The first term
  pulls toward the gold answer, the second pushes away from the failure. What the gold
  continuation is (the anchor) is the caller's: the source anchors on the gold answer
  (``gradient.commands.recovery``, ``revise.anchor=answer``, the default); the reading built
  first (``spliced_tail``, an ablation) splices the reference's remaining steps and answer.
  The away term is registered: ``log`` (``log p(fail)``, unbounded below; the default) or
  ``unlikelihood`` (``-log(1 - p(fail))``, bounded below by 0).
* **Frank-Wolfe.** The linear minimiser of ``<grad_t, s>`` over the simplex is the vertex of
  the smallest gradient entry; ``w_t <- (1 - gamma_k) w_t + gamma_k onehot(argmin_v
  grad_t[v])`` with ``gamma_k = 2 / (k + 2)`` for ``k = first_step .. first_step + K - 1``,
  every position at once. ``first_step = 0`` is the textbook schedule (its first step goes
  all the way to a vertex); a larger one keeps more of the rollout. The vertices are the
  ordinary tokens: special tokens (padding, BOS, EOS, mask, unknown) are never chosen, so a
  decoded prefix never ends early. Iterates stay on the simplex by construction (tested).
* **Continuing.** As the source does, continuations start from the revised soft prefix
  itself: the prompt's embeddings followed by ``soft_embeddings`` of the final weights fill
  the KV cache, and decoding goes on token by token (``gradient.commands.recovery``, arm
  ``soft``). A soft prefix has no text, so a trajectory built from it is written with a
  token prefix (the rollout's own, or the argmax one below) and judged by the verifier as
  that text; whether it still passes is measured, not assumed.
* **Back to tokens** (the ablation arm ``hard``): the argmax of each position's weights
  (ties: the lower id), a prefix the model can be sampled from and trained on as it is.
  ``revise`` measures both log-likelihoods after this hard prefix as well as after the
  soft one, because the loss's figures are those of the soft prefix.

``revise`` counts its cost in token passes: a forward pass over a sequence of n tokens costs
n, a backward pass 2n (the usual estimate of a backward pass at twice a forward). One step
reads two rows, the context (prompt and prefix, c tokens) before the gold continuation and
before the failed one: ``2 c + n_gold + n_fail`` tokens. K steps forward and backward, and
one forward pass measuring the final prefix, cost ``(3 K + 1) (2 c + n_gold + n_fail)``; the
forward pass measuring the hard prefix is a diagnostic and is not charged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from populations.registry import Registry

# An away term: log p(fail) (a 0-d tensor) -> the quantity the loss adds lambda times.
AWAY_TERMS: Registry[Callable[[torch.Tensor], torch.Tensor]] = Registry("away term")

# Token passes of a backward pass, per token, against 1 for a forward pass.
BACKWARD_COST = 2


def frank_wolfe_step(weights_T_V: torch.Tensor, grad_T_V: torch.Tensor, k: int,
                     allowed_V: torch.Tensor | None = None) -> torch.Tensor:
    """One Frank-Wolfe step on a product of simplices (one per row).

    Args:
        weights_T_V: current points, each row on the probability simplex.
        grad_T_V: the loss gradient with respect to them.
        k: the step index; the step size is ``2 / (k + 2)`` (Jaggi 2013).
        allowed_V: bool mask of the vertices the linear minimiser may pick (None = all).

    Returns the new ``(T, V)`` weights: ``(1 - gamma) w + gamma onehot(argmin_v grad[v])``.
    """
    if allowed_V is not None:
        grad_T_V = grad_T_V.masked_fill(~allowed_V, float("inf"))
    vertex_T = grad_T_V.argmin(dim=-1)
    gamma = 2.0 / (k + 2.0)
    s_T_V = torch.nn.functional.one_hot(vertex_T, weights_T_V.shape[-1]).to(weights_T_V.dtype)
    return (1.0 - gamma) * weights_T_V + gamma * s_T_V


def hard_decode(weights_T_V: torch.Tensor) -> list[int]:
    """The token of largest weight at each position (the lowest id among ties)."""
    return weights_T_V.argmax(dim=-1).tolist()


@AWAY_TERMS.register("log")
def log_away(fail_logp: torch.Tensor) -> torch.Tensor:
    """``log p(fail)`` itself: lowering it has no floor (the reading built first)."""
    return fail_logp


@AWAY_TERMS.register("unlikelihood")
def unlikelihood_away(fail_logp: torch.Tensor) -> torch.Tensor:
    """``-log(1 - p(fail))`` of the whole failed continuation: >= 0, and 0 once the failure
    is impossible, so the push away is bounded. Departure from Welleck et al. (2019), who
    apply it per token: here it takes the whole continuation's probability, so the term and
    its gradient vanish once the failure is already improbable."""
    # A certain failure (log p = 0) would make the loss infinite; the clamp caps it near 16.
    return -torch.log(-torch.expm1(fail_logp.clamp(max=-1e-7)))


def continuation_logp(model, context_1_S_D: torch.Tensor, target_ids: list[int]) -> torch.Tensor:
    """Summed log-probability of ``target_ids`` after input embeddings ``context_1_S_D`` (a
    0-d tensor, differentiable with respect to the context); 0 for an empty target."""
    if not target_ids:
        return context_1_S_D.sum() * 0.0
    embed = model.get_input_embeddings()
    target_1_T = torch.tensor([target_ids], device=context_1_S_D.device)
    inputs_1_L_D = torch.cat([context_1_S_D, embed(target_1_T[:, :-1])], dim=1)
    S, T = context_1_S_D.shape[1], len(target_ids)
    logits_T_V = model(inputs_embeds=inputs_1_L_D).logits[0, S - 1:S - 1 + T].float()
    return torch.log_softmax(logits_T_V, -1).gather(-1, target_1_T[0, :, None]).sum()


def soft_embeddings(model, weights_T_V: torch.Tensor) -> torch.Tensor:
    """The input embeddings ``(T, D)`` of a soft prefix: ``weights_T_V @ E``, times the
    scale an embedding module applies to its rows where it has one (Gemma's sqrt(hidden)),
    so that a one-hot row gives exactly what the module returns for its token (tested on
    every stand-in architecture)."""
    embed = model.get_input_embeddings()
    E_V_D = embed.weight
    soft_T_D = weights_T_V.to(E_V_D.dtype) @ E_V_D
    scale = getattr(embed, "embed_scale", None)
    return soft_T_D if scale is None else soft_T_D * scale.to(E_V_D.dtype)


@dataclass(frozen=True)
class RevisionProblem:
    """One failed rollout cut into the parts the loss reads (token ids: the prompt's with its
    BOS, the continuations ending in EOS where the text ended, no other special token)."""

    prompt_ids: list[int]
    prefix_ids: list[int]
    gold_ids: list[int]
    fail_ids: list[int]


@dataclass(frozen=True)
class Revision:
    # The final simplex weights (T, V), their hard decoding, the loss and the two
    # log-likelihoods under the soft prefix before each step and after the last, and the
    # revision's token passes.
    weights_T_V: torch.Tensor
    prefix_ids: list[int]
    losses: list[float]
    gold_logp: list[float]
    fail_logp: list[float]
    token_passes: int
    # The two log-likelihoods after the hard-decoded prefix, the tokens the continuations
    # are sampled from (log p(fail) is 0 when lambda is 0, as under the soft prefix).
    hard_gold_logp: float
    hard_fail_logp: float


def revise_loss(model, prompt_1_P_D: torch.Tensor, weights_T_V: torch.Tensor,
                gold_ids: list[int], fail_ids: list[int], lam: float,
                away: Callable[[torch.Tensor], torch.Tensor] = log_away
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(L, log p(gold), log p(fail))`` with ``L = -log p(gold) + lam away(log p(fail))``,
    both given the prompt's embeddings and the soft prefix ``weights_T_V @ E``; with ``lam``
    0 the failed continuation is not read and its log-likelihood is returned as 0."""
    soft_1_T_D = soft_embeddings(model, weights_T_V)[None]
    context_1_S_D = torch.cat([prompt_1_P_D, soft_1_T_D], dim=1)
    gold = continuation_logp(model, context_1_S_D, gold_ids)
    fail = continuation_logp(model, context_1_S_D, fail_ids) if lam else gold.detach() * 0.0
    return -gold + lam * away(fail), gold, fail


def hard_prefix_logp(model, prompt_1_P_D: torch.Tensor, prefix_ids: list[int],
                     gold_ids: list[int], fail_ids: list[int], lam: float) -> tuple[float, float]:
    """``(log p(gold), log p(fail))`` after the prompt and the token prefix ``prefix_ids``:
    what the continuations actually see, where the revision's own figures are for the soft
    prefix they never see. The prefix enters as one-hot weights, whose embeddings are the
    tokens' own (tested), so both figures read through the same code."""
    V = model.get_input_embeddings().weight.shape[0]
    onehot_T_V = torch.nn.functional.one_hot(
        torch.tensor(prefix_ids, device=prompt_1_P_D.device), V).float()
    with torch.no_grad():
        _, gold, fail = revise_loss(model, prompt_1_P_D, onehot_T_V, gold_ids, fail_ids, lam)
    return float(gold), float(fail)


def revise(model, problem: RevisionProblem, steps: int, lam: float, first_step: int = 0,
           allowed_V: torch.Tensor | None = None,
           away: Callable[[torch.Tensor], torch.Tensor] = log_away) -> Revision:
    """``steps`` Frank-Wolfe steps on the soft prefix of ``problem`` with the model frozen
    (its parameters get no gradient), then the log-likelihoods after its hard decoding; see
    the module docstring."""
    V = model.get_input_embeddings().weight.shape[0]
    device = model.get_input_embeddings().weight.device
    with torch.no_grad():
        prompt_1_P_D = model.get_input_embeddings()(
            torch.tensor([problem.prompt_ids], device=device))
    weights_T_V = torch.nn.functional.one_hot(
        torch.tensor(problem.prefix_ids, device=device), V).float()
    losses, gold_lp, fail_lp = [], [], []
    context = len(problem.prompt_ids) + len(problem.prefix_ids)
    per_step = (context + len(problem.gold_ids)) + (
        context + len(problem.fail_ids) if lam and problem.fail_ids else 0)
    requires = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        for k in range(first_step, first_step + steps + 1):
            w = weights_T_V.clone().requires_grad_(True)
            loss, gold, fail = revise_loss(model, prompt_1_P_D, w, problem.gold_ids,
                                           problem.fail_ids, lam, away)
            losses.append(float(loss.detach()))
            gold_lp.append(float(gold.detach()))
            fail_lp.append(float(fail.detach()))
            if k == first_step + steps:
                break  # the last pass only measures the final point
            (grad_T_V,) = torch.autograd.grad(loss, w)
            weights_T_V = frank_wolfe_step(weights_T_V, grad_T_V, k, allowed_V)
        hard_ids = hard_decode(weights_T_V)
        hard_gold, hard_fail = hard_prefix_logp(model, prompt_1_P_D, hard_ids, problem.gold_ids,
                                                problem.fail_ids, lam)
    finally:
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)
    # The hard-prefix measurement is a diagnostic, not part of the method: not charged.
    passes = steps * (1 + BACKWARD_COST) * per_step + per_step
    return Revision(weights_T_V=weights_T_V, prefix_ids=hard_ids, losses=losses,
                    gold_logp=gold_lp, fail_logp=fail_lp, token_passes=passes,
                    hard_gold_logp=hard_gold, hard_fail_logp=hard_fail)
