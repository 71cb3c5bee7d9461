"""The soft prompt both embeddings-prefill checks start from (``test_latent_revise.py`` and
``vllm_embeds_check.py``, which runs in its own process)."""

from __future__ import annotations

import torch

from gradient.maths.latent_revise import soft_embeddings


def one_hot_soft(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Per token prompt, ``[L, D]``: its one-hot rows through ``soft_embeddings``, i.e. the
    input embeddings the model gives those very tokens."""
    V = model.get_input_embeddings().weight.shape[0]
    with torch.no_grad():
        return [soft_embeddings(model, torch.nn.functional.one_hot(torch.tensor(p), V).float())
                for p in prompts]
