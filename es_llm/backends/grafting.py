"""Activation grafting on a Hugging Face decoder: residual-stream edits through forward hooks.

A graft mixes donor activations into the output of one decoder layer over a span of prompt
positions, ``h[b, s] <- h[b, s] + c_b (d_b[s] - h[b, s])``, in the prompt's forward pass only
(decoding steps that follow see the edited cache). Row b of a batch has its own donor and
coefficient, so one generate call runs several perturbed greedy chains of one prompt; a
coefficient of 0 leaves the row exactly as it was.

Donors (``donor_*``) are activations at the same layer: of another prompt (position by
position; a shorter one is padded with its last position), or one mean vector.
Zhou et al. (arXiv 2606.19636) use such grafts to find problems that sampling never solves
but a deterministic nudge does (``es_llm.compare.blind_spot``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a causal LM (``model.model.layers``); ValueError otherwise."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(f"{type(model).__name__} has no decoder layers at model.layers; "
                         f"grafting needs a causal decoder (Llama, Qwen2, Mistral style)")
    return layers


def check_layer(model, layer: int) -> int:
    """``layer`` as a non-negative index (negative counts from the end); ValueError when out
    of range."""
    n = len(decoder_layers(model))
    if not -n <= layer < n:
        raise ValueError(f"layer {layer} is out of range: the model has {n} decoder layers "
                         f"(0..{n - 1}, or -{n}..-1 from the end)")
    return layer % n


@torch.no_grad()
def layer_activations(model, ids: Sequence[int], layer: int) -> torch.Tensor:
    """``(T, H)``: the output of decoder layer ``layer`` at each position of prompt ``ids``."""
    captured = {}

    def keep(module, args, out):
        captured["h"] = (out[0] if isinstance(out, tuple) else out)[0].detach().clone()

    handle = decoder_layers(model)[check_layer(model, layer)].register_forward_hook(keep)
    try:
        device = next(model.parameters()).device
        model(input_ids=torch.tensor([list(ids)], device=device))
    finally:
        handle.remove()
    return captured["h"]


def align_donor(donor_S_H: torch.Tensor, T: int) -> torch.Tensor:
    """A donor cut or padded (with its last position) to ``T`` positions."""
    if donor_S_H.shape[0] >= T:
        return donor_S_H[:T]
    pad = donor_S_H[-1:].expand(T - donor_S_H.shape[0], -1)
    return torch.cat([donor_S_H, pad])


def mix(h_B_T_H: torch.Tensor, donors_B_S_H: torch.Tensor, coef_B: torch.Tensor,
        span: slice) -> torch.Tensor:
    """``h`` with ``h[:, span] + c_b (d_b - h[:, span])`` on the span, unchanged elsewhere."""
    out = h_B_T_H.clone()
    part = out[:, span]
    out[:, span] = part + coef_B.to(part)[:, None, None] * (donors_B_S_H.to(part) - part)
    return out


@contextmanager
def grafted(model, layer: int, donors_B_T_H: torch.Tensor, coef_B: Sequence[float],
            span: slice):
    """Within the block, the forward pass over a full batch of B prompts of length T (the
    prefill: an input of T positions) has ``mix`` applied at ``layer``'s output. Decoding
    steps (one position each) pass unchanged."""
    coef = torch.tensor(list(coef_B), dtype=torch.float32)
    T = donors_B_T_H.shape[1]
    donors = donors_B_T_H[:, span]

    def hook(module, args, out):
        h = out[0] if isinstance(out, tuple) else out
        if h.shape[1] != T or h.shape[0] != len(coef):
            return None
        h = mix(h, donors, coef, span)
        return (h, *out[1:]) if isinstance(out, tuple) else h

    handle = decoder_layers(model)[check_layer(model, layer)].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
