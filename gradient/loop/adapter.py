"""LoRA for the gradient trainers (``lora.enabled``): the policy becomes a PEFT model whose
adapter alone is trained (``es_llm.adapters`` holds the adapter's maths and files).

The base weights stay the float32 ones of ``cfg.model``, frozen; the adapter's factors start
from ``init_factors`` with a seed derived from the run's, or, on resume, from the
checkpoint's ``adapter/``. A checkpoint folder's weights are the merged model ``W + (alpha /
r) B A`` computed in float32, so transformers, vLLM and ``es-llm eval`` read it as any model;
a vLLM rollout engine holds the base and serves the adapter (``setup.serve_policy_adapter``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from es_llm.adapters import (LoraSettings, load_peft_factors, merged_parameters, peft_factors,
                             read_adapter, save_adapter, wrap_model)
from es_llm.io import save_hf_checkpoint
from gradient.loop.seeds import derive_seed

ADAPTER_FOLDER = "adapter"


def adapt(model: torch.nn.Module, lora: LoraSettings, seed: int,
          resume_from: Path | None = None, checkpointing: bool = False):
    """The policy with a trainable adapter: fresh factors from the run ``seed``, or those of
    the checkpoint ``resume_from``. ``checkpointing``: gradient checkpointing is on, whose
    re-entrant form needs inputs that require grad when the embedding is frozen."""
    if checkpointing:
        model.enable_input_require_grads()
    wrapped = wrap_model(model, lora, derive_seed(seed, "lora"))
    if resume_from is not None:
        load_peft_factors(wrapped, read_adapter(resume_from / ADAPTER_FOLDER))
    return wrapped


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: all of a plain policy, the adapter's of a PEFT
    one (its base is frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def save_policy(model: torch.nn.Module, tokenizer, folder: Path, lora: LoraSettings,
                base_model: str, extra=None) -> None:
    """``save_hf_checkpoint`` of the policy; with an adapter the folder holds the merged
    model plus ``adapter/`` in PEFT's format (``PeftModel.from_pretrained(base,
    folder / "adapter")`` loads it). ``extra(tmp)`` adds the trainer's own files."""
    if not lora.enabled:
        save_hf_checkpoint(model, tokenizer, folder, data_from=base_model, extra=extra)
        return

    def with_adapter(tmp: Path) -> None:
        save_adapter(tmp / ADAPTER_FOLDER, peft_factors(model), lora, base_model)
        if extra is not None:
            extra(tmp)
    save_hf_checkpoint(model.get_base_model(), tokenizer, folder, data_from=base_model,
                       extra=with_adapter, state_dict=merged_parameters(model, lora))
