"""Generation backends: one interface (``Backend.generate``) with Hugging Face, vLLM and the
diffusion sampler behind it, each built by ``make_backend`` from one ``BackendSpec``
(``factory.py``)."""

from __future__ import annotations

from es_llm.backends.base import Backend, Completion, SamplingParams
from es_llm.backends.factory import (BACKEND_NAMES, BackendSpec, check_device, choose_backend,
                                     make_backend, require_vllm)
from es_llm.backends.vllm_backend import lora_engine_args

__all__ = ["Backend", "BackendSpec", "Completion", "SamplingParams", "check_device",
           "choose_backend", "lora_engine_args", "make_backend", "require_vllm", "BACKEND_NAMES"]
