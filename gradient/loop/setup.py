"""Build the GRPO loop's edges from a config: policy, optimizer, sampler, task, reference."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from es_llm.adapters import LoraSettings, peft_factors
from es_llm.backends import (BackendSpec, check_device, choose_backend, lora_engine_args,
                             make_backend)
from es_llm.backends.diffusion import is_diffusion_model, saved_sampling
from es_llm.errors import BadInput
from es_llm.finite import check_start
from es_llm.models import check_model_path
from es_llm.runtime import check_context
from es_llm.tasks import build_task
from es_llm.tasks.chat import render_prompts
from gradient.config import GRPORunConfig
from gradient.distill.methods import method_spec
from gradient.loop.adapter import adapt, trainable
from gradient.loop.batch import Rollout
from gradient.loop.precision import Precision, load_policy
from gradient.loop.state import Edges, TrainerState
from gradient.maths.adaprefix import PrefixState
from gradient.maths.replay import AdvantageReplayBuffer


def saved_step(checkpoint: Path) -> int:
    """The step a checkpoint folder was saved after (its ``trainer_state.pt``)."""
    return torch.load(checkpoint / "trainer_state.pt", map_location="cpu",
                      weights_only=False)["step"]


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint of a run folder with the most steps (``trainer_state.pt`` present)."""
    best, best_step = None, -1
    for folder in (out / "checkpoints").glob("*"):
        if (folder / "trainer_state.pt").is_file():
            step = saved_step(folder)
            if step > best_step:
                best, best_step = folder, step
    return best


def _check_same_tokenizer(a, b, what: str) -> None:
    if a.get_vocab() != b.get_vocab() or a.eos_token_id != b.eos_token_id:
        raise BadInput(f"{what} has a different tokenizer from the policy (vocabulary or EOS "
                       f"differ); log-probs of the same token ids would not be comparable. "
                       f"Use a model trained with the policy's tokenizer.")


def _check_references(problems: list, cfg: GRPORunConfig, what: str = "algo.prefix.enabled"
                      ) -> None:
    missing = [p.id for p in problems if not p.meta.get("reference")]
    if missing:
        raise BadInput(f"{what} needs a reference solution for every training "
                       f"problem, but {len(missing)} of {len(problems)} problems of task "
                       f"{cfg.task.name!r} have none (e.g. {missing[0]!r}). Use a data file "
                       f"with a 'reference' field (testbed data/*_rl.jsonl files have one) or "
                       f"turn the prefix controller off.")


def _distill_models(cfg: GRPORunConfig, tokenizer, problems: list, model_class) -> dict:
    """The frozen models the distillation method declares, by role, each checked to share
    the student's tokenizer; the base is the student's starting folder."""
    from transformers import AutoTokenizer

    d = cfg.algo.distill
    if d.method == "none":
        return {}
    spec = method_spec(d.method)
    if (why := spec.needs_references(d)) is not None:
        _check_references(problems, cfg, why)
    paths = {"teacher": d.teacher, "base": cfg.model, "positive": d.w2s.positive,
             "negative": d.w2s.negative}
    models = {}
    for role in spec.models:
        path = paths[role]
        check_model_path(path, f"the {role} model")
        _check_same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(path),
                              f"the {role} model {path!r}" if role != "teacher"
                              else f"the teacher {path!r}")
        model = model_class.from_pretrained(path, **cfg.runtime.load_kwargs())
        models[role] = model.to(cfg.runtime.device).requires_grad_(False)
    return models


def load_recovered(path: str, task, problems: list, tokenizer) -> dict:
    """``problem id -> (prompt ids, completion ids + EOS, reward)`` of LatentRevise's
    recovered trajectories in ``path`` (``recovered.jsonl``), each verified again by the
    task: a row of another problem set or one the verifier rejects is bad input."""
    from es_llm.tasks.loading import load_records

    rows = load_records(path)
    by_id = {p.id: p for p in problems}
    kept, pairs = [], []
    for n, row in enumerate(rows, start=1):
        pid = row.get("id") if isinstance(row, dict) else None
        completion = row.get("completion") if isinstance(row, dict) else None
        if pid not in by_id or not isinstance(completion, str):
            raise BadInput(f"algo.recovered.data {path!r} row {n} is not a recovered trajectory "
                           f"of a training problem (it needs the 'id' of one of the run's "
                           f"{len(problems)} problems and a 'completion' string; "
                           f"`es-llm latent-revise` writes such a file).")
        kept.append(row)
        pairs.append((by_id[pid], completion))
    scores = task.score_many(pairs) if pairs else []
    wrong = [row["id"] for row, sc in zip(kept, scores) if not sc.correct]
    if wrong:
        raise BadInput(f"algo.recovered.data {path!r}: {len(wrong)} trajectories fail the "
                       f"task's verifier (e.g. {wrong[0]!r}); only verified trajectories may "
                       f"be trained on.")
    out = {}
    for row, sc in zip(kept, scores):
        ids = tokenizer(row["completion"], add_special_tokens=False).input_ids
        out.setdefault(row["id"], (list(tokenizer(by_id[row["id"]].prompt).input_ids),
                                   list(ids) + [tokenizer.eos_token_id], float(sc.reward)))
    return out


def records_states(cfg: GRPORunConfig) -> bool:
    """Whether the diffusion sampler must keep every intermediate state of a rollout (a
    divergence to a later state of the trajectory: dOPSD)."""
    from gradient.distill.scoring import self_view_divergence

    d = cfg.algo.distill
    return d.method != "none" and method_spec(d.method).divergence is self_view_divergence


def _check_estimator(cfg: GRPORunConfig) -> bool:
    """Whether the policy is a masked-diffusion model, after checking that the configured
    log-prob estimator is one for its kind of model (and the sampler can serve it)."""
    from gradient.dllm.estimators import estimator_names, estimator_spec

    diffusion = is_diffusion_model(cfg.model)
    name = cfg.algo.dllm.estimator
    if estimator_spec(name).diffusion != diffusion:
        kind = "a masked-diffusion model" if diffusion else "an autoregressive model"
        valid = [n for n in estimator_names() if estimator_spec(n).diffusion == diffusion]
        raise BadInput(f"{cfg.model} is {kind}, but algo.dllm.estimator is {name!r}; valid "
                       f"estimators for it are: {', '.join(valid)} (see configs/dllm_*.yaml).")
    choose_backend(cfg.backend, cfg.model)  # refuses a sampler that cannot serve the model
    if diffusion and cfg.lora.enabled:
        raise BadInput(f"{cfg.model} is a masked-diffusion model; lora.enabled trains "
                       f"adapters of causal LMs only (the diffusion estimators and sampler "
                       f"read the model's own weights). Set lora.enabled=false.")
    if diffusion:
        if cfg.rollout.top_p < 1:
            raise BadInput("the diffusion sampler samples with temperature only; set "
                           "rollout.top_p=1.")
        if saved_sampling(cfg.model).gen_length > cfg.rollout.max_tokens:
            raise BadInput(f"rollout.max_tokens ({cfg.rollout.max_tokens}) is shorter than the "
                           f"model's canvas (gen_length {saved_sampling(cfg.model).gen_length} "
                           f"in {cfg.model}/diffusion_sampling.json); completions would be cut "
                           f"after decoding. Set rollout.max_tokens to the canvas length.")
    return diffusion


def push_policy(backend, model) -> None:
    """After an update: the policy's weights into the vLLM engine that samples the rollouts."""
    backend.push_weights({n: p.detach() for n, p in model.named_parameters()})


def serve_policy_adapter(backend, model, lora: LoraSettings, base_model: str) -> None:
    """With ``lora``: the policy's adapter to the vLLM engine, which holds the base and
    serves the adapter with its own LoRA layers. Closer to the trainer's log-probs than
    merged weights pushed into the engine (measured by tests/vllm_lora_check.py): the
    engine computes ``W x + s B (A x)`` as the PEFT policy does."""
    backend.serve_adapter(peft_factors(model), lora, base_model)


def policy_sampler(cfg: GRPORunConfig, start: str, model, tokenizer, diffusion: bool
                   ) -> BackendSpec:
    """What samples the rollouts: the policy itself (hf, or the diffusion sampler with the
    model's saved settings, one micro-batch per call), or a vLLM engine loaded from
    ``start`` that the trainer pushes the policy into after each update; with ``lora`` an
    engine loaded from the base ``cfg.model`` that serves the policy's adapter. Log-probs
    are the sampler's processed ones, those an importance ratio at the rollout temperature
    needs."""
    lora = cfg.lora.enabled
    served = lora and choose_backend(cfg.backend, cfg.model) == "vllm"
    return BackendSpec(cfg.model if lora else start, backend=cfg.backend, runtime=cfg.runtime,
                       seed=cfg.seed, model=model, tokenizer=tokenizer,
                       weights="fixed" if lora else "pushed", logprobs_mode="processed",
                       engine_args=lora_engine_args(cfg.lora.rank) if served else None,
                       batch_size=cfg.micro_batch if diffusion else None,
                       diffusion_sampling=saved_sampling(cfg.model) if diffusion else None,
                       record_states=records_states(cfg))


def build(cfg: GRPORunConfig, resume_from: Path | None = None):
    """``(edges, problems, state)``; with ``resume_from`` (a checkpoint folder) the policy,
    optimizer, step, prefix controller and replay buffer continue from it."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    check_model_path(cfg.model)
    diffusion = _check_estimator(cfg)
    model_class = AutoModelForMaskedLM if diffusion else AutoModelForCausalLM
    check_device(cfg.runtime.device)
    task = build_task(cfg.task)
    problems = task.problems()
    if not problems:
        raise BadInput(f"task {cfg.task.name!r} gave no training problems (data={cfg.task.data!r}).")
    if cfg.algo.prefix.enabled:
        _check_references(problems, cfg)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    start = str(resume_from) if resume_from is not None else cfg.model
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    problems = render_prompts(problems, tokenizer, cfg.task.chat, cfg.model)
    if not diffusion:
        check_context(cfg.model, tokenizer, [p.prompt for p in problems], cfg.rollout.max_tokens,
                      cfg.runtime, where="rollout.max_tokens")
    # With an adapter the base is always cfg.model: a checkpoint holds the merged weights.
    policy_path = cfg.model if cfg.lora.enabled else start
    model = load_policy(model_class, policy_path, cfg.runtime)
    check_start(model.named_parameters(), policy_path)
    if cfg.lora.enabled:
        model = adapt(model, cfg.lora, cfg.seed, resume_from,
                      cfg.runtime.gradient_checkpointing)
    ref = None
    if cfg.algo.kl.coef > 0:
        ref_path = cfg.algo.kl.ref_model or cfg.model
        check_model_path(ref_path, "the reference model")
        _check_same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(ref_path),
                              f"the reference model {ref_path!r}")
        ref = model_class.from_pretrained(ref_path, **cfg.runtime.load_kwargs())
        ref = ref.to(cfg.runtime.device)
        ref.requires_grad_(False)
    teachers = _distill_models(cfg, tokenizer, problems, model_class)
    optimizer = cfg.optim.adamw(trainable(model))
    state = TrainerState()
    precision = Precision(cfg.runtime)
    if cfg.algo.prefix.enabled:
        state.prefix = PrefixState()
    if cfg.algo.replay.enabled:
        state.replay = AdvantageReplayBuffer(cfg.algo.replay)
    if resume_from is not None:
        saved = torch.load(resume_from / "trainer_state.pt", map_location=cfg.runtime.device,
                           weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        precision.load_state_dict(saved.get("loss_scale"))
        state.step, state.samples = saved["step"], saved["samples"]
        if state.prefix is not None and saved["prefix"] is not None:
            state.prefix = PrefixState.from_dict(saved["prefix"])
        if state.replay is not None and saved["replay"] is not None:
            # States saved before rollouts were typed hold field dicts.
            items = [dict(it, payload=Rollout.from_saved(it["payload"]))
                     for it in saved["replay"]["items"]]
            state.replay.load_state_dict({**saved["replay"], "items": items})
    backend = make_backend(policy_sampler(cfg, start, model, tokenizer, diffusion))
    # The HF and diffusion samplers decode with the policy itself: no weight sync.
    sync = None
    if backend.name == "vllm":
        sync = (partial(serve_policy_adapter, backend, model, cfg.lora, cfg.model)
                if cfg.lora.enabled else partial(push_policy, backend, model))
        if cfg.lora.enabled:
            sync()  # the engine holds the base: it samples with the adapter from step 0
    recovered = (load_recovered(cfg.algo.recovered.data, task, problems, tokenizer)
                 if cfg.algo.recovered.data else {})
    edges = Edges(model=model, tokenizer=tokenizer, backend=backend, task=task,
                  optimizer=optimizer, ref_model=ref, sync=sync, teachers=teachers,
                  block_length=backend.sampling.block_length if diffusion else 1,
                  recovered=recovered, precision=precision)
    return edges, problems, state
