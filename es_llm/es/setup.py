"""Build the ES loop's edges from a config: communicator, model, weights, sampler, task."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import torch

from es_llm.adapters import init_factors, target_linears
from es_llm.backends import BackendSpec, check_device, make_backend
from es_llm.backends.lowrank_rows import RowAdapters
from es_llm.comm.placement import place_rank
from es_llm.errors import BadInput
from es_llm.es.config import ESRunConfig
from es_llm.es.engine import Edges
from es_llm.es.evotorch_loop import check_search_fits
from es_llm.es.weights import AdapterWeights, ModuleWeights, select_parameters
from es_llm.models import check_model_path
from es_llm.runtime import check_context
from es_llm.tasks import build_task
from es_llm.tasks.chat import render_prompts


def build_edges(cfg: ESRunConfig, comm) -> tuple[Edges, list]:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    check_model_path(cfg.model)
    task = build_task(cfg.task)
    problems = task.problems()
    if not problems:
        raise BadInput(f"task {cfg.task.name!r} gave no training problems (data={cfg.task.data!r}).")
    if cfg.engine.prompts_per_member > len(problems):
        raise BadInput(f"engine.prompts_per_member={cfg.engine.prompts_per_member} does not "
                       f"fit: the training data has only {len(problems)} problems; choose at "
                       f"most {len(problems)} (0 = the whole batch).")
    rows = cfg.engine.serve == "rows"
    spec = BackendSpec(cfg.model, backend=cfg.backend, runtime=cfg.runtime, seed=cfg.seed,
                       weights="es", batch_size=_batch_size(cfg, len(problems)),
                       hf_only=("engine.serve=rows runs the population inside the HF decoding "
                                "loop of a causal LM (use engine.serve=weights)" if rows else None))
    chosen = spec.choice()
    if cfg.lora.enabled:
        check_adapter_backend(chosen, cfg.lora.target_modules)
    check_device(cfg.runtime.device)
    place_rank(comm.local_rank, comm.local_size, cfg.runtime.device, cfg.bind_cores)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    problems = render_prompts(problems, tokenizer, cfg.task.chat, cfg.model)
    if chosen != "diffusion":
        check_context(cfg.model, tokenizer, [p.prompt for p in problems], cfg.max_tokens,
                      cfg.runtime)
    auto_class = AutoModelForMaskedLM if chosen == "diffusion" else AutoModelForCausalLM
    model = auto_class.from_pretrained(cfg.model, **cfg.runtime.load_kwargs())
    model.to(cfg.runtime.device)
    if cfg.lora.enabled:
        linears = target_linears(model, cfg.lora)
        weights = AdapterWeights(linears, init_factors(linears, cfg.lora,
                                                       adapter_seed(cfg.seed)), cfg.lora)
        names = list(weights.params)
    else:
        names = select_parameters(model, cfg.engine.params, cfg.engine.param_pattern)
        if cfg.es.kind == "lowrank":
            check_lowrank_rank(model, names, cfg.es.rank)
        weights = ModuleWeights(model, names)
    if cfg.es.algorithm != "es":
        # Before the engine starts and before anything is written: a search that cannot
        # fit is refused with its size.
        check_search_fits(cfg, weights.master)
    # hf and diffusion decode with this very module, so a member's weights written into it
    # are what they sample; vLLM gets them through its worker extension.
    backend = make_backend(replace(spec, model=model, tokenizer=tokenizer))
    if chosen == "vllm":
        from es_llm.backends.vllm_weights import VLLMWeights
        weights = VLLMWeights(backend.llm, weights)
    return Edges(comm=comm, model=model, tokenizer=tokenizer, weights=weights, backend=backend,
                 task=task, rows=RowAdapters(model, names) if rows else None), problems


def _batch_size(cfg: ESRunConfig, problems: int) -> int | None:
    """With rows, one generate call is one chunk of members: the HF batch must hold it (and
    is never below HF's default of 512). None (the backend's default) otherwise."""
    if cfg.engine.serve != "rows":
        return None
    per_call = cfg.engine.members_per_call * (cfg.engine.prompts_per_member
                                              or min(cfg.prompts_per_iteration, problems))
    return max(512, per_call)


def check_lowrank_rank(model: torch.nn.Module, names: list[str], rank: int) -> None:
    """BadInput unless ``rank`` fits every evolving matrix (rank <= min(out, in))."""
    params = dict(model.named_parameters())
    shapes = {n: tuple(params[n].shape) for n in names if params[n].ndim == 2}
    if not shapes:
        raise BadInput("es.kind=lowrank perturbs matrices, and the selected parameters have "
                       "none; choose engine.params=all or matrices.")
    name, smallest = min(shapes.items(), key=lambda kv: min(kv[1]))
    if rank > min(smallest):
        raise BadInput(f"es.rank={rank} is above the rank a perturbation of {name} (shape "
                       f"{smallest}) can have; choose es.rank between 1 and {min(smallest)}.")


def adapter_seed(run_seed: int) -> int:
    """The seed of the adapter's initial factors: a pure function of the run seed (so every
    rank and every resume starts from the same adapter), apart from the noise keys' stream."""
    digest = hashlib.blake2b(f"{run_seed}:lora-init".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


# vLLM serves these HF layers fused into one tensor (qkv_proj, gate_up_proj): a write must
# carry every part.
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def check_adapter_backend(chosen: str, targets: tuple[str, ...]) -> None:
    """BadInput when the chosen backend cannot serve an evolving adapter: the diffusion
    sampler (PEFT's causal-LM adapter format does not describe it), or vLLM with a target
    list that splits one of its fused layers."""
    if chosen == "diffusion":
        raise BadInput("lora.enabled evolves and saves a causal-LM adapter; a diffusion model "
                       "is not supported. Set lora.enabled=false to evolve its weights.")
    if chosen != "vllm":
        return
    for group in _FUSED:
        picked = [t for t in group if t in targets]
        if picked and len(picked) < len(group):
            raise BadInput(f"lora.target_modules takes {', '.join(picked)} but not "
                           f"{', '.join(t for t in group if t not in picked)}; vLLM serves "
                           f"{'+'.join(group)} as one fused weight, so a member's merged "
                           f"weights must cover all of them. Add the others to "
                           f"lora.target_modules, or use backend=hf.")
