"""The model settings every command shares: device, precision, context and engine memory.

Every command's config has one ``runtime`` section of this type (``runtime.dtype=bfloat16``
on any command line), so a checkpoint is read at the precision, on the device and within
the context it was trained at, by eval, compare, ES and every trainer alike. A run folder's
``config.yaml`` records the section; ``es-llm compare`` reads it back to refuse comparing
models trained at different precisions.

What ``dtype`` means differs by role, the same way in every command:

* a model that only generates (eval, compare, testtime, the frozen reference and teachers,
  the vLLM rollout engine) is loaded in ``dtype``;
* ES keeps a float32 master copy and serves the population in ``dtype``;
* a trainer (grpo, opd, sft, latent-revise) keeps float32 master weights and float32 AdamW
  state and computes forward and backward passes in ``dtype`` under ``torch.autocast``
  (mixed precision); float16 adds a dynamic loss scale, as float16 gradients underflow.

The checks here run at load, before anything is sampled or written: a context too short for
the task's prompts plus ``max_tokens``, a tokenizer without an end-of-sequence token, and a
head size or dtype vLLM's CPU attention cannot serve are one-paragraph ``BadInput`` errors.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from es_llm.config import check_choices, choice
from es_llm.errors import BadInput

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION = ("auto", "eager", "sdpa", "flash_attention_2")
KV_CACHES = ("dynamic", "static", "compiled")


@dataclass(frozen=True)
class Runtime:
    # Device of every model the command loads: cpu or cuda (under MPI, each rank takes the
    # GPU of its local rank).
    device: str = choice("cpu", lambda: ("cpu", "cuda"))
    # Precision: float32, bfloat16 or float16. Generation (eval, compare, the rollout engine,
    # ES members) runs in it; ES keeps a float32 master copy; trainers keep float32 weights
    # and optimizer state and compute in it under autocast (mixed precision).
    dtype: str = choice("float32", lambda: DTYPES)
    # Context length in tokens (prompt + completion) the engines are built for; null = the
    # model's own (max_position_embeddings). Checked at load against the longest prompt plus
    # max_tokens.
    max_model_len: int | None = None
    # vLLM on a GPU: the share of the GPU's memory the engine may take (weights, activations
    # and KV cache), in (0, 1].
    gpu_memory_utilization: float = 0.3
    # vLLM on the CPU: GiB of memory reserved for the KV cache (VLLM_CPU_KVCACHE_SPACE);
    # raise it (or lower max_model_len) when the engine says the KV cache does not fit.
    cpu_kv_cache_gib: int = 1
    # transformers' attention implementation: auto (transformers' default), eager, sdpa or
    # flash_attention_2 (needs the flash-attn package and a GPU).
    attn_implementation: str = choice("auto", lambda: ATTENTION)
    # The HF backend's KV cache: dynamic (grows by one position a step), static (preallocated
    # for the call's prompt + max_tokens) or compiled (static, with the decode step compiled
    # by torch.compile; CUDA graphs on a GPU). Greedy ids are the same with all three; which
    # is fastest depends on the model, batch and device (docs/benchmarks.md).
    kv_cache: str = choice("dynamic", lambda: KV_CACHES)
    # Trainers (grpo, opd, sft, latent-revise): recompute activations in the backward pass
    # instead of keeping them, trading compute for memory.
    gradient_checkpointing: bool = False

    def __post_init__(self):
        check_choices(self, "runtime.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise BadInput(f"runtime.max_model_len must be a positive number of tokens or null "
                           f"(the model's own context), got {self.max_model_len}.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise BadInput(f"runtime.gpu_memory_utilization must lie in (0, 1], got "
                           f"{self.gpu_memory_utilization}.")
        if self.cpu_kv_cache_gib < 1:
            raise BadInput(f"runtime.cpu_kv_cache_gib must be at least 1 GiB, got "
                           f"{self.cpu_kv_cache_gib}.")

    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    def load_kwargs(self) -> dict:
        """``from_pretrained`` keywords of a model that only generates (or is frozen)."""
        return {"dtype": self.torch_dtype(), **self.attention_kwargs()}

    def attention_kwargs(self) -> dict:
        return ({} if self.attn_implementation == "auto"
                else {"attn_implementation": self.attn_implementation})

    def autocast(self):
        """The context a trainer computes in: autocast to ``dtype`` on ``device``, or nothing
        in float32."""
        import torch

        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=self.torch_dtype())

    def grad_scaler(self):
        """float16 training's dynamic loss scale (None in the other dtypes, whose exponent
        range keeps small gradients)."""
        import torch

        return torch.amp.GradScaler(self.device) if self.dtype == "float16" else None


def text_config(model_path: str | Path) -> dict:
    """The language model's part of a folder's config.json (its ``text_config`` when it has
    one); empty when the file does not read."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg.get("text_config") or cfg if isinstance(cfg, dict) else {}


def model_context(model_path: str | Path) -> int | None:
    """The model's own context length (``max_position_embeddings``), None when its config
    names none."""
    n = text_config(model_path).get("max_position_embeddings")
    return n if isinstance(n, int) else None


def check_context(model_path: str | Path, tokenizer, prompts: Sequence[str], max_tokens: int,
                  runtime: Runtime, where: str = "max_tokens") -> None:
    """BadInput, before anything runs, when the longest prompt plus ``max_tokens`` does not
    fit the context: the model's own and ``runtime.max_model_len``, the smaller of the two.
    Past it, vLLM stops at the context and transformers generates on, so the two backends
    would score different texts. ``tokenizer`` None: the folder's. For causal LMs: a
    masked-diffusion model denoises a canvas of its own fixed length."""
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
    own = model_context(model_path)
    limits = [(n, what) for n, what in ((own, "the model's context (max_position_embeddings)"),
                                        (runtime.max_model_len, "runtime.max_model_len"))
              if n is not None]
    if not limits or not prompts:
        return
    limit, what = min(limits)
    longest = max(len(tokenizer(p).input_ids) for p in prompts)
    if longest + max_tokens > limit:
        raise BadInput(f"the longest prompt is {longest} tokens and {where} is {max_tokens}, "
                       f"{longest + max_tokens} in all, but {what} is {limit} tokens "
                       f"({model_path}). Lower {where} to at most {max(limit - longest, 0)}, "
                       f"shorten the prompts (task.select, task.limit), or use a model with a "
                       f"longer context; runtime.max_model_len may not exceed the model's own "
                       f"({own}).")


def check_tokenizer(tokenizer, model_path: str | Path) -> None:
    """BadInput when the tokenizer has no end-of-sequence token: generation would never stop
    before max_tokens and no completion could be scored as finished."""
    if tokenizer.eos_token_id is None:
        raise BadInput(f"the tokenizer of {model_path} has no end-of-sequence token "
                       f"(eos_token); set one in its tokenizer_config.json (e.g. the model's "
                       f"<|endoftext|> or </s>) before generating with it.")
