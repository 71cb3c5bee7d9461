"""Teacher-forced log-probabilities of sampled completions under the trainer's model.

All rows go through the model as one batch of ``[prompt ; completion]`` rows: prompts are
left-padded and completions right-padded to a common length, so every row's first
completion token sits in the same column ``P`` and the logits that score completion token
``t`` come from column ``P - 1 + t`` in every row. Only those positions reach the LM head
(``logits_to_keep``), so the float32 log-softmax costs ``B x T x V``, not ``B x L x V``.
"""

from __future__ import annotations

from typing import Sequence

import torch


def completion_logprobs(model, prompt_ids: Sequence[Sequence[int]],
                        completion_ids: Sequence[Sequence[int]], *, temperature: float,
                        pad_id: int, with_entropy: bool = True, micro_batch: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-probability of each completion token given its prompt and the completion before it,
    under ``log_softmax(logits / temperature)`` computed in float32.

    ``model`` is a Hugging Face causal LM (its forward takes ``attention_mask``,
    ``position_ids`` and ``logits_to_keep``); it is used as it is (train or eval mode, any
    device: the batch is built on the device of its parameters). ``prompt_ids`` and
    ``completion_ids`` are ``B`` lists of token ids; every prompt must be non-empty.

    ``temperature`` must be the sampler's: TRL divides the trainer's logits by the sampling
    temperature, and vLLM's processed logprobs are after the same division, so the two sides
    of an importance ratio describe the same distribution. Top-p is not applied here.

    Returns ``(logp_B_T, entropy_B_T, mask_B_T)``, float32 on the model's device, with ``T``
    the longest completion: ``logp_B_T[i, t]`` is the log-probability of
    ``completion_ids[i][t]``, ``entropy_B_T[i, t]`` the entropy of the same distribution
    (``None`` unless ``with_entropy``), and ``mask_B_T`` is 1 on real completion tokens and 0
    on padding, where ``logp`` and ``entropy`` are 0.

    Gradients flow to the model's parameters unless the call runs under ``torch.no_grad()``
    (old or reference log-probs). ``micro_batch`` runs at most that many rows through the
    model at a time and concatenates the results; this bounds peak memory under
    ``no_grad``. With gradients every chunk's graph stays alive until ``backward``, so a
    trainer bounds memory by calling this per micro-batch and calling ``backward`` on each
    chunk's loss (gradient accumulation) instead.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (the sampler's temperature), got {temperature}")
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token to condition the completion on")
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
    B = len(prompt_ids)
    T = max((len(c) for c in completion_ids), default=0)
    step = micro_batch or max(B, 1)
    parts = [_score_rows(model, prompt_ids[s:s + step], completion_ids[s:s + step], T,
                         temperature, pad_id, with_entropy) for s in range(0, B, step)]
    if not parts:
        device = next(model.parameters()).device
        empty_B_T = torch.zeros((0, T), device=device)
        return empty_B_T, (empty_B_T if with_entropy else None), empty_B_T
    logp_B_T = torch.cat([p[0] for p in parts])
    entropy_B_T = torch.cat([p[1] for p in parts]) if with_entropy else None
    return logp_B_T, entropy_B_T, torch.cat([p[2] for p in parts])


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


def _score_rows(model, prompt_ids, completion_ids, T: int, temperature: float, pad_id: int,
                with_entropy: bool):
    """``completion_logprobs`` for one micro-batch, padded to ``T`` completion tokens."""
    if T == 0:
        device = next(model.parameters()).device
        empty_B_T = torch.zeros((len(prompt_ids), 0), device=device)
        return empty_B_T, empty_B_T, empty_B_T
    logp_B_T_V, targets_B_T, mask_B_T, _ = completion_logits(
        model, prompt_ids, completion_ids, T, temperature, pad_id)
    logp_B_T, entropy_B_T = token_stats(logp_B_T_V, targets_B_T, mask_B_T, with_entropy)
    return logp_B_T, entropy_B_T, mask_B_T


def pad_rows(rows_B: list[list[float]], T: int, device) -> torch.Tensor:
    """Per-row float lists (log-probs, weights, advantages) right-padded with 0 to ``(B, T)``."""
    out_B_T = torch.zeros((len(rows_B), T), dtype=torch.float32)
    for i, r in enumerate(rows_B):
        out_B_T[i, :len(r)] = torch.as_tensor(r, dtype=torch.float32)
    return out_B_T.to(device)
