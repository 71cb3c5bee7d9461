"""Teacher-forced log-probabilities of sampled completions under the trainer's model (the
autoregressive estimator of ``gradient.dllm.estimators`` and the distillation scorers).

All rows go through the model as one batch of ``[prompt ; completion]`` rows: prompts are
left-padded and completions right-padded to a common length, so every row's first
completion token sits in the same column ``P`` and the logits that score completion token
``t`` come from column ``P - 1 + t`` in every row. Only those positions reach the LM head
(``logits_to_keep``), so the float32 log-softmax costs ``B x T x V``, not ``B x L x V``.
"""

from __future__ import annotations

from typing import Sequence

import torch


def pack_rows(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
              T: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids_B_L, attention_B_L)`` with ``L = P + T``, ``P`` the longest prompt: prompts
    end at column ``P`` (left padding), completions start there (right padding)."""
    B, P = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids_B_L = torch.full((B, P + T), pad_id, dtype=torch.long)
    attention_B_L = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids_B_L[i, P - len(p):P + len(c)] = torch.as_tensor([*p, *c], dtype=torch.long)
        attention_B_L[i, P - len(p):P + len(c)] = 1
    return ids_B_L, attention_B_L


def completion_logits(model, prompt_ids, completion_ids, T: int, temperature: float,
                      pad_id: int, hidden_layer: int | None = None):
    """The full next-token distributions at the completion positions, one forward pass.

    Returns ``(logp_B_T_V, targets_B_T, mask_B_T, hidden_B_T_H)``: ``log_softmax(logits /
    temperature)`` in float32 at the ``T`` positions that predict completion tokens, the
    completion token ids there (pad where masked), the completion mask, and, when
    ``hidden_layer`` is given, that layer's hidden states at the same positions (the state
    the prediction is made from; ``-1`` = the last layer), else ``None``. Gradients flow
    unless the caller runs under ``torch.no_grad()``.

    ``temperature`` must be the sampler's: vLLM's processed log-probs are after the same
    division (as TRL's trainer does it), so both sides of an importance ratio describe one
    distribution. Top-p is not applied here.
    """
    device = next(model.parameters()).device
    ids_B_L, attention_B_L = (x.to(device) for x in pack_rows(prompt_ids, completion_ids,
                                                               T, pad_id))
    L = ids_B_L.shape[1]
    mask_B_T = attention_B_L[:, L - T:].float()
    # Positions count real tokens only, as in generation, so a left-padded row sees the
    # same positions as the unpadded prompt.
    position_B_L = (attention_B_L.cumsum(-1) - 1).clamp(min=0)
    # The last T + 1 columns are P - 1 ... L - 1; the first T of them predict the completion
    # tokens (the last one would predict a token after the longest completion).
    out = model(input_ids=ids_B_L, attention_mask=attention_B_L, position_ids=position_B_L,
                use_cache=False, logits_to_keep=T + 1,
                output_hidden_states=hidden_layer is not None)
    logits_B_T_V = out.logits[:, :-1]
    hidden_B_T_H = None
    if hidden_layer is not None:
        hidden_B_T_H = out.hidden_states[hidden_layer][:, L - T - 1:L - 1]
    # Neither the division nor the log-softmax keeps its input for backward, so the
    # scaled float32 copy is freed as soon as the log-probs exist.
    logp_B_T_V = torch.log_softmax(logits_B_T_V.float() / temperature, dim=-1)
    del out, logits_B_T_V
    return logp_B_T_V, ids_B_L[:, L - T:], mask_B_T, hidden_B_T_H


def token_stats(logp_B_T_V: torch.Tensor, targets_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                with_entropy: bool = True):
    """``(logp_B_T, entropy_B_T or None)`` of the targets under ``logp_B_T_V``, 0 where masked."""
    logp_B_T = logp_B_T_V.gather(-1, targets_B_T[..., None]).squeeze(-1) * mask_B_T
    entropy_B_T = None
    if with_entropy:
        entropy_B_T = -(logp_B_T_V.exp() * logp_B_T_V).sum(-1) * mask_B_T
    return logp_B_T, entropy_B_T


def pad_rows(rows_B: list[list[float]], T: int, device) -> torch.Tensor:
    """Per-row float lists (log-probs, weights, advantages) right-padded with 0 to ``(B, T)``."""
    out_B_T = torch.zeros((len(rows_B), T), dtype=torch.float32)
    for i, r in enumerate(rows_B):
        out_B_T[i, :len(r)] = torch.as_tensor(r, dtype=torch.float32)
    return out_B_T.to(device)
