"""``es-llm sft``: supervised fine-tuning on a file of (prompt, completion) rows.

What LatentRevise's recovered trajectories are used for (``recovered.jsonl`` of
``es-llm latent-revise``), and its control, SFT on as many of the base model's own correct
rollouts (``base_rollouts.jsonl``). The loss is the pretraining loss of the testbed: the
mean negative log-likelihood of the completion's tokens and the EOS after it, the prompt
unscored (``es_llm.testbed.train.completion_batch``); AdamW with the GRPO runs' optimizer
settings, the rows shuffled once per epoch by a seeded generator. Writes ``config.yaml``,
``metrics.jsonl`` (one line per step) and ``checkpoints/final``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from es_llm.adapters import LoraSettings
from es_llm.backends import check_device
from es_llm.backends.diffusion import is_diffusion_model
from es_llm.config import check_choices, run_config_yaml
from es_llm.errors import BadInput
from es_llm.finite import Diverged, check, check_start, check_update, stop_error
from es_llm.io import jsonl_lines, write_text_atomic
from es_llm.models import check_model_path
from es_llm.run_folder import AppendLog, written
from es_llm.runtime import Runtime
from es_llm.testbed.train import completion_batch
from gradient.config import OptimSettings
from gradient.loop.adapter import adapt, save_policy, trainable
from gradient.loop.precision import Precision, load_policy
from gradient.loop.seeds import derive_seed


@dataclass(frozen=True)
class SFTRunConfig:
    # The starting model (a causal LM folder).
    model: str = ""
    # JSONL rows with a `prompt` and a `completion` string each (other fields are ignored).
    data: str = ""
    # Use only the first N rows (null = all).
    limit: int | None = None
    # Passes over the rows and rows per optimizer step.
    epochs: int = 3
    batch_size: int = 16
    # Seed of the per-epoch shuffles.
    seed: int = 0
    # Device, precision (float32 master weights and optimizer state, compute in
    # runtime.dtype) and gradient checkpointing.
    runtime: Runtime = field(default_factory=Runtime)
    optim: OptimSettings = field(default_factory=lambda: OptimSettings(lr=1e-4))
    # Train a LoRA adapter (PEFT) instead of every weight: the optimizer sees the adapter
    # only, the checkpoint holds the merged model plus adapter/.
    lora: LoraSettings = field(default_factory=LoraSettings)

    def __post_init__(self):
        check_choices(self)
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise BadInput(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.limit is not None and self.limit < 1:
            raise BadInput(f"limit must be at least 1 (or null for every row), got {self.limit}.")


def read_rows(path: str, limit: int | None = None) -> list[tuple[str, str]]:
    """``(prompt, completion)`` pairs of a JSONL file; BadInput naming the first bad line."""
    if not path:
        raise BadInput("sft needs data=FILE: a JSONL file with a prompt and a completion per "
                       "line (e.g. recovered.jsonl from `es-llm latent-revise`).")
    rows = []
    for n, _, row in jsonl_lines(path, "the SFT data"):
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str) and row["prompt"]
                and isinstance(row.get("completion"), str)):
            raise BadInput(f"{path} line {n} is not a JSON object with a non-empty 'prompt' "
                           f"string and a 'completion' string; every line needs both.")
        rows.append((row["prompt"], row["completion"]))
    if not rows:
        raise BadInput(f"{path} has no rows; SFT needs at least one (prompt, completion).")
    return rows[:limit] if limit else rows


def steps_of(cfg: SFTRunConfig, rows: int) -> int:
    return cfg.epochs * math.ceil(rows / cfg.batch_size)


def sft_step(model, tokenizer, optimizer, precision: Precision, cfg: SFTRunConfig,
             batch: list[tuple[str, str]], head: dict) -> dict:
    """One optimizer step on ``batch``; its metrics after ``head`` (step and epoch). Raises
    ``Diverged`` at a non-finite loss, gradient norm or update."""
    t0 = time.perf_counter()
    ids, labels = completion_batch(batch, tokenizer)
    cfg.optim.set_lr(optimizer, head["step"])
    ids, labels = ids.to(cfg.runtime.device), labels.to(cfg.runtime.device)
    metrics = {**head, "rows": ids.shape[0], "tokens": int((labels != -100).sum())}
    moved = bool(optimizer.state)  # AdamW keeps state once it has stepped (or was resumed)
    with precision.compute():
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(),
                     labels=labels).loss
    check("loss", "loss", float(loss), moved, metrics)
    metrics["loss"] = float(loss)
    optimizer.zero_grad(set_to_none=True)
    precision.backward(loss)
    precision.unscale(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
    if not precision.overflowed(float(norm)):
        check("gradient norm", "grad_norm", float(norm), moved, metrics)
    metrics["grad_norm"] = float(norm)
    metrics.update(precision.step(optimizer))
    check_update(model.parameters(), "update", metrics)
    return {**metrics, "perf/step_s": time.perf_counter() - t0}


def run_sft(cfg: SFTRunConfig, out: Path, progress: bool = True) -> dict:
    """Fine-tune ``cfg.model`` on ``cfg.data``; returns the last step's metrics."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_path(cfg.model)
    if is_diffusion_model(cfg.model):
        raise BadInput(f"{cfg.model} is a masked-diffusion model; es-llm sft trains causal LMs.")
    check_device(cfg.runtime.device)
    rows = read_rows(cfg.data, cfg.limit)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    model = load_policy(AutoModelForCausalLM, cfg.model, cfg.runtime)
    precision = Precision(cfg.runtime)
    check_start(model.named_parameters(), cfg.model)
    if cfg.lora.enabled:
        model = adapt(model, cfg.lora, cfg.seed,
                      checkpointing=cfg.runtime.gradient_checkpointing)
    optimizer = cfg.optim.adamw(trainable(model))
    again = "es-llm sft --config ... (a new --out)"
    with written(out, again):
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
        write_text_atomic(out / "metrics.jsonl", "")
    log = AppendLog(out / "metrics.jsonl", again)
    total, step, metrics = steps_of(cfg, len(rows)), 0, {}
    bar = tqdm(total=total, desc="sft", unit="step", disable=not progress)
    model.train()
    try:
        for epoch in range(cfg.epochs):
            order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(
                derive_seed(cfg.seed, "sft", epoch))).tolist()
            for start in range(0, len(rows), cfg.batch_size):
                metrics = sft_step(model, tokenizer, optimizer, precision, cfg,
                                   [rows[i] for i in order[start:start + cfg.batch_size]],
                                   {"step": step, "epoch": epoch})
                log.write_row(metrics)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.3f}")
    except Diverged as exc:
        log.write_row(exc.row())
        raise stop_error(exc, "step", step, cfg.optim.advice(), out) from None
    finally:
        log.close()
        bar.close()
    model.eval()
    with written(out / "checkpoints" / "final", again):
        save_policy(model, tokenizer, out / "checkpoints" / "final", cfg.lora, cfg.model)
    return metrics
