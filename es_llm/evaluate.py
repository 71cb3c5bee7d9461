"""Sample a model on a task's problems, score every sample, compute the shared metrics.

``evaluate`` is the whole of ``es-llm eval``; ``sample_and_score`` is the part the testbed
build and later trainers reuse.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from es_llm.backends import BACKEND_NAMES, BackendSpec, SamplingParams, make_backend
from es_llm.config import check_choices, choice, run_config_yaml
from es_llm.errors import BadInput
from es_llm.io import write_json_atomic, write_jsonl_atomic, write_text_atomic
from es_llm.metrics.summary import evaluation_metrics, format_table
from es_llm.models import check_model_path, resolve_task_config
from es_llm.overlap import check_overlap
from es_llm.run_folder import check_out_path
from es_llm.runtime import Runtime, check_context
from es_llm.tasks import Problem, TaskConfig, build_task
from es_llm.tasks.base import too_long_notice
from es_llm.tasks.chat import render_for_model


@dataclass(frozen=True)
class SamplingConfig:
    # Samples per problem; pass@k is reported for k = 1, 2, 4, ... up to n.
    n: int = 64
    # 0 = greedy. The same settings must be used for every model being compared.
    temperature: float = 1.0
    # Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.
    top_p: float = 1.0
    # Longest completion in tokens.
    max_tokens: int = 64
    # Seed of the sampler (same seed, same backend, same samples).
    seed: int = 0

    def __post_init__(self):
        self.params()  # validates n, temperature, top_p, max_tokens with clear messages

    def params(self) -> SamplingParams:
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_tokens, seed=self.seed)


@dataclass(frozen=True)
class EvalConfig:
    # A Hugging Face model folder (config.json + weights + tokenizer), e.g. a testbed build.
    model: str = ""
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Generation backend: auto (vLLM when installed), hf or vllm; or reference (no model:
    # every problem answered with its own reference solution, a check of the verifier).
    backend: str = choice("auto", lambda: (*BACKEND_NAMES, "reference"))
    # Device, dtype, context length and engine memory of the evaluated model.
    runtime: Runtime = field(default_factory=Runtime)
    # Bootstrap resamples over problems for the 95% confidence intervals.
    bootstrap: int = 1000
    # Seed for the metric estimators' own randomness (bootstrap, maj@k subsets).
    metrics_seed: int = 0
    # Refuse (exit 2) to evaluate a training run's checkpoint on problems that run trained
    # on (the same prompt); false only warns.
    strict_overlap: bool = False

    def __post_init__(self):
        check_choices(self)
        if self.bootstrap < 10:
            raise BadInput(f"bootstrap must be at least 10 resamples, got {self.bootstrap}.")
        if not self.model and self.task.chat.template:
            raise BadInput("task.chat.template=on renders prompts through a model's chat "
                           "template, and no --model is given; name the model folder whose "
                           "template to use, or leave it off.")


def sample_and_score(backend, task, problems: list[Problem], params: SamplingParams,
                     progress: bool = True) -> list[dict]:
    """Generate ``params.n`` samples per problem and score them; one row per sample, whose
    ``prompt`` is the text the model was sent (and ``raw_prompt`` the task's own, when a chat
    template rendered it)."""
    outs = backend.generate([p.prompt for p in problems], params, progress=progress,
                            keys=[p.id for p in problems])
    pairs = [(p, c.text) for p, row in zip(problems, outs) for c in row]
    scores = []
    with tqdm(total=len(pairs), desc="score", unit="sample", disable=not progress) as bar:
        for start in range(0, len(pairs), 1024):
            scores += task.score_many(pairs[start:start + 1024])
            bar.update(min(1024, len(pairs) - start))
    rows, it = [], iter(scores)
    for p, row in zip(problems, outs):
        for s, c in enumerate(row):
            sc = next(it)
            rows.append({"problem_id": p.id, "sample_index": s, "prompt": p.prompt,
                         **({} if p.raw_prompt is None else {"raw_prompt": p.raw_prompt}),
                         "completion": c.text, "reward": sc.reward, "correct": sc.correct,
                         "answer": sc.answer, "difficulty": p.difficulty,
                         "num_tokens": len(c.token_ids), "finish_reason": c.finish_reason,
                         **{k: v for k, v in sc.details().items() if k != "answer"}})
    return rows


def metrics_from_rows(rows: list[dict], n: int, bootstrap: int = 1000, seed: int = 0) -> dict:
    """Group sample rows by problem (in first-seen order) and compute the metrics dict."""
    order, groups = [], {}
    for r in rows:
        if r["problem_id"] not in groups:
            order.append(r["problem_id"])
            groups[r["problem_id"]] = []
        groups[r["problem_id"]].append(r)
    g = [sorted(groups[i], key=lambda r: r["sample_index"]) for i in order]
    return evaluation_metrics(
        problem_ids=order,
        correct=[np.array([r["correct"] for r in rs], dtype=bool) for rs in g],
        answer_keys=[[r.get("answer_key") for r in rs] for rs in g],
        solution_keys=[[r.get("solution_key") for r in rs] for rs in g],
        texts=[[r["completion"] for r in rs] for rs in g],
        n=n, rng=np.random.default_rng(seed),
        difficulties=[rs[0].get("difficulty", 0) for rs in g],
        num_resamples=bootstrap,
    )


def evaluate(cfg: EvalConfig, out: str | Path, progress: bool = True, echo=print,
             on_folder=None) -> dict:
    """Run ``es-llm eval``: validate everything first, then sample, score and write;
    ``on_folder(out)`` is called once the output folder exists."""
    reference = cfg.backend == "reference"
    out = check_out_path(out)
    if not reference or cfg.model:
        check_model_path(cfg.model)
    cfg = resolve_task_config(cfg)
    task = build_task(cfg.task)
    try:
        problems = task.problems()
        if not problems:
            raise BadInput(f"task {cfg.task.name!r} produced no problems (data={cfg.task.data!r}, "
                           f"limit={cfg.task.limit}).")
        if cfg.model:
            check_overlap(problems, cfg.model, cfg.strict_overlap, echo)
            problems = render_for_model(problems, cfg.model, cfg.task.chat)
        t0 = time.perf_counter()
        if reference:
            from es_llm.backends.reference import ReferenceBackend
            backend = ReferenceBackend(problems, cfg.task.name)
        else:
            spec = BackendSpec(cfg.model, backend=cfg.backend, runtime=cfg.runtime,
                               seed=cfg.sampling.seed)
            if spec.choice() != "diffusion":
                check_context(cfg.model, None, [p.prompt for p in problems],
                              cfg.sampling.max_tokens, cfg.runtime, where="sampling.max_tokens")
            backend = make_backend(spec)
        t_load = time.perf_counter() - t0
        echo(f"evaluating {cfg.model or 'the reference solutions'} on {len(problems)} "
             f"{cfg.task.name} problems, n={cfg.sampling.n}, T={cfg.sampling.temperature}, "
             f"backend={backend.name}")
        t0 = time.perf_counter()
        rows = sample_and_score(backend, task, problems, cfg.sampling.params(), progress)
        t_gen = time.perf_counter() - t0
        backend.close()
    finally:
        task.close()
    metrics = metrics_from_rows(rows, cfg.sampling.n, cfg.bootstrap, cfg.metrics_seed)
    metrics["perf"] = {"load_s": round(t_load, 2), "sample_and_score_s": round(t_gen, 2),
                       "samples_per_s": round(len(rows) / max(t_gen, 1e-9), 1)}
    metrics["config"] = {"model": cfg.model, "task": cfg.task.name, "data": cfg.task.data,
                         "backend": backend.name}
    metrics["too_long"] = sum(bool(r["too_long"]) for r in rows)
    if metrics["too_long"]:
        echo(too_long_notice(metrics["too_long"], cfg.task.max_completion_chars,
                             "of this evaluation", "too_long"))
    write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
    write_jsonl_atomic(out / "samples.jsonl", rows)
    write_json_atomic(out / "metrics.json", metrics)
    if on_folder is not None:
        on_folder(out)
    echo(format_table(metrics))
    echo(f"wrote {out / 'samples.jsonl'} and {out / 'metrics.json'}")
    return metrics
