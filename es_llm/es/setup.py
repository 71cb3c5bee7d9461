"""Build the ES loop's edges from a config: communicator, model, weights, sampler, task."""

from __future__ import annotations

import torch

from es_llm.backends import choose_backend
from es_llm.backends.diffusion import DiffusionBackend, is_diffusion_model
from es_llm.backends.lowrank_rows import RowAdapters
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
    if cfg.es.prompts_per_member > len(problems):
        raise BadInput(f"es.prompts_per_member={cfg.es.prompts_per_member} does not fit: the "
                       f"training data has only {len(problems)} problems; choose at most "
                       f"{len(problems)} (0 = the whole batch).")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' was asked for but torch sees no CUDA device; use "
                       "device=cpu.")
    place_rank(comm.local_rank, comm.local_size, cfg.device, cfg.bind_cores)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    rows = cfg.es.serve == "rows"
    if rows and is_diffusion_model(cfg.model):
        raise BadInput("es.serve=rows runs the population inside the HF decoding loop of a "
                       "causal LM; use es.serve=weights for diffusion models.")
    chosen = choose_backend(cfg.backend, cfg.model, hf_only=(
        "es.serve=rows runs the population inside the HF decoding loop of a causal LM (use "
        "es.serve=weights for vllm)" if rows else None))
    diffusion = chosen == "diffusion"
    auto_class = AutoModelForMaskedLM if diffusion else AutoModelForCausalLM
    model = auto_class.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype))
    model.to(cfg.device)
    names = select_parameters(model, cfg.es.params, cfg.es.param_pattern)
    if cfg.es.kind == "lowrank":
        check_lowrank_rank(model, names, cfg.es.rank)
    weights = ModuleWeights(model, names)
    if diffusion:
        # Perturbation is the same in-place edit of the module; only decoding differs.
        backend = DiffusionBackend(cfg.model, model=model, tokenizer=tokenizer, device=cfg.device)
    elif chosen == "vllm":
        from es_llm.backends.vllm_backend import VLLMBackend
        from es_llm.backends.vllm_weights import VLLMWeights
        backend = VLLMBackend(cfg.model, seed=cfg.seed, dtype=cfg.dtype, for_es=True)
        weights = VLLMWeights(backend.llm, weights)
    else:
        # With rows, one generate call is one chunk of members: the batch must hold it.
        per_call = cfg.es.members_per_call * (cfg.es.prompts_per_member
                                              or min(cfg.prompts_per_iteration, len(problems)))
        backend = HFBackend(cfg.model, model=model, tokenizer=tokenizer, device=cfg.device,
                            batch_size=max(512, per_call if rows else 0))
    return Edges(comm=comm, model=model, tokenizer=tokenizer, weights=weights, backend=backend,
                 task=task, rows=RowAdapters(model, names) if rows else None), problems


def check_lowrank_rank(model: torch.nn.Module, names: list[str], rank: int) -> None:
    """BadInput unless ``rank`` fits every evolving matrix (rank <= min(out, in))."""
    params = dict(model.named_parameters())
    shapes = {n: tuple(params[n].shape) for n in names if params[n].ndim == 2}
    if not shapes:
        raise BadInput("es.kind=lowrank perturbs matrices, and the selected parameters have "
                       "none; choose es.params=all or matrices.")
    name, smallest = min(shapes.items(), key=lambda kv: min(kv[1]))
    if rank > min(smallest):
        raise BadInput(f"es.rank={rank} is above the rank a perturbation of {name} (shape "
                       f"{smallest}) can have; choose es.rank between 1 and {min(smallest)}.")
