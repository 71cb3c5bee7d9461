"""Build the ES loop's edges from a config: communicator, model, weights, sampler, task."""

from __future__ import annotations

import torch

from es_llm.backends import require_vllm
from es_llm.backends.diffusion import DiffusionBackend, is_diffusion_model
from es_llm.backends.vllm_backend import vllm_available
from es_llm.comm.placement import place_rank
from es_llm.errors import BadInput
from es_llm.es.config import ESRunConfig
from es_llm.es.engine import Edges
from es_llm.es.weights import ModuleWeights, select_parameters
from es_llm.evaluate import check_model_path
from es_llm.tasks import build_task


def build_edges(cfg: ESRunConfig, comm) -> tuple[Edges, list]:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    from es_llm.backends.hf import HFBackend

    check_model_path(cfg.model)
    task = build_task(cfg.task)
    problems = task.problems()
    if not problems:
        raise BadInput(f"task {cfg.task.name!r} gave no training problems (data={cfg.task.data!r}).")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' was asked for but torch sees no CUDA device; use "
                       "device=cpu.")
    place_rank(comm.local_rank, comm.local_size, cfg.device, cfg.bind_cores)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    diffusion = is_diffusion_model(cfg.model)
    if diffusion and cfg.backend == "vllm":
        raise BadInput(f"{cfg.model} is a masked-diffusion model, which the vllm backend cannot "
                       f"serve; use backend=auto or hf (its members decode with the diffusion "
                       f"sampler).")
    auto_class = AutoModelForMaskedLM if diffusion else AutoModelForCausalLM
    model = auto_class.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype))
    model.to(cfg.device)
    names = select_parameters(model, cfg.es.params, cfg.es.param_pattern)
    weights = ModuleWeights(model, names)
    use_vllm = not diffusion and (
        cfg.backend == "vllm" or (cfg.backend == "auto" and vllm_available()))
    if diffusion:
        # Perturbation is the same in-place edit of the module; only decoding differs.
        backend = DiffusionBackend(cfg.model, model=model, tokenizer=tokenizer, device=cfg.device)
    elif use_vllm:
        require_vllm()
        from es_llm.backends.vllm_backend import VLLMBackend
        from es_llm.backends.vllm_weights import VLLMWeights
        backend = VLLMBackend(cfg.model, seed=cfg.seed, dtype=cfg.dtype, for_es=True)
        weights = VLLMWeights(backend.llm, weights)
    else:
        backend = HFBackend(cfg.model, model=model, tokenizer=tokenizer, device=cfg.device)
    return Edges(comm=comm, model=model, tokenizer=tokenizer, weights=weights, backend=backend,
                 task=task), problems
