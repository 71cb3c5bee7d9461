"""Build the embedded testbed: held-out problem sets, a char tokenizer, a pretrained Llama.

Everything is a pure function of the ``TestbedConfig`` (seeded ``random.Random`` streams
for data, a seeded torch generator for initialisation), so a build is cached under the
config's fingerprint and reused.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from es_llm.backends.base import SamplingParams
from es_llm.config import dump_yaml, to_dict
from es_llm.errors import BadInput
from es_llm.io import replace_dir_atomic, write_json_atomic, write_jsonl_atomic, write_text_atomic
from es_llm.tasks import arithmetic, countdown
from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.tokenizer import build_tokenizer


def cache_root() -> Path:
    return Path(os.environ.get("ES_LLM_CACHE", Path.home() / ".cache" / "es-llm")) / "testbed"


def _problem_key(problem) -> str:
    g = problem.gold
    if isinstance(g, dict) and "numbers" in g:
        return f"cd:{sorted(g['numbers'])}:{g['target']}"
    return f"ar:{problem.prompt}"


def _countdown_example(rng: random.Random, tier: int, data) -> tuple:
    return countdown.generate(rng, tier, max_number=data.countdown_max_number,
                              max_target=data.countdown_max_target)


def _distinct(draw, count: int, seen: set, what: str) -> list:
    """``count`` problems from ``draw()`` whose keys are not in ``seen`` (which grows)."""
    problems, tries = [], 0
    while len(problems) < count:
        tries += 1
        if tries > 200 * count:
            raise BadInput(f"could not draw {count} distinct held-out {what} problems (found "
                           f"{len(problems)}); the tier's problem space is too small: lower "
                           f"data.eval_per_tier / data.rl_per_tier or widen the number range.")
        problem, _ = draw()
        key = _problem_key(problem)
        if key not in seen:
            seen.add(key)
            problems.append(problem)
    return problems


def held_out_sets(cfg: TestbedConfig) -> tuple[dict[str, list], set]:
    """Countdown eval/rl sets and an arithmetic eval set, disjoint from each other; also
    returns the keys of all of them, which training never uses."""
    data, sets, seen = cfg.data, {}, set()
    rng = random.Random(f"{cfg.seed}:held-out")
    for split, per_tier in (("eval", data.eval_per_tier), ("rl", data.rl_per_tier)):
        problems = []
        for tier in data.countdown_tiers:
            problems += _distinct(lambda: _countdown_example(rng, tier, data), per_tier, seen,
                                  f"countdown tier-{tier}")
        sets[f"countdown_{split}"] = _renumber(problems, f"countdown-{split}")
    problems = []
    for tier in data.arithmetic_tiers:
        problems += _distinct(lambda: arithmetic.generate(rng, tier), data.eval_per_tier, seen,
                              f"arithmetic tier-{tier}")
    sets["arithmetic_eval"] = _renumber(problems, "arithmetic-eval")
    return sets, seen


def _renumber(problems, prefix):
    from dataclasses import replace
    return [replace(p, id=f"{prefix}-{i:05d}") for i, p in enumerate(problems)]


def _record(problem) -> dict:
    rec = {"id": problem.id, "prompt": problem.prompt, "difficulty": problem.difficulty}
    if isinstance(problem.gold, dict):
        rec.update(problem.gold)
    else:
        rec["answer"] = problem.gold
    return rec


def training_example(rng: random.Random, cfg: TestbedConfig, excluded: set) -> tuple[str, str]:
    """One (prompt, completion) pair from the training mix, never a held-out problem."""
    data = cfg.data
    while True:
        if rng.random() < data.arithmetic_share:
            problem, completion = arithmetic.generate(rng, rng.choice(data.arithmetic_tiers))
        else:
            tier = rng.choices(data.countdown_tiers, weights=data.countdown_weights)[0]
            problem, completion = _countdown_example(rng, tier, data)
        if _problem_key(problem) not in excluded:
            return problem.prompt, completion


def make_model(cfg: TestbedConfig, tokenizer):
    """A randomly initialised Llama-architecture causal LM.

    Llama rather than Qwen2: transformers 5 maps the ``qwen2`` model type to its byte-level
    BPE tokenizer class, which rebuilds a loaded character tokenizer and drops its spaces;
    ``llama`` has no such mapping, so ``AutoTokenizer`` loads tokenizer.json as saved.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    m = cfg.model
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size, max_position_embeddings=m.max_positions,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    # Initialise under a private RNG state so the build never touches the caller's.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    return model


def _batch(examples: list[tuple[str, str]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels; only completion tokens (and EOS) carry a loss."""
    rows, labels = [], []
    for prompt, completion in examples:
        p = tokenizer(prompt).input_ids
        c = tokenizer(completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(p + c)
        labels.append([-100] * len(p) + c)
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), L), -100, dtype=torch.long)
    for i, (r, l) in enumerate(zip(rows, labels)):
        ids[i, :len(r)] = torch.tensor(r)
        lab[i, :len(l)] = torch.tensor(l)
    return ids, lab


def train(model, tokenizer, cfg: TestbedConfig, excluded: set, progress: bool = True) -> dict:
    """Next-token pretraining on completions with AdamW and a cosine schedule."""
    t = cfg.train
    rng = random.Random(f"{cfg.seed}:train")
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay,
                            betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < t.warmup_steps:
            return t.lr * (step + 1) / t.warmup_steps
        frac = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
        return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    losses = []
    bar = tqdm(range(t.steps), desc="pretrain", unit="step", disable=not progress)
    for step in bar:
        ids, labels = _batch([training_example(rng, cfg, excluded) for _ in range(t.batch_size)],
                             tokenizer)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(),
                     labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
    model.eval()
    return {"final_loss": sum(losses[-100:]) / len(losses[-100:]), "steps": t.steps}


def _count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _report(model_dir: Path, cfg: TestbedConfig, progress: bool) -> dict:
    """pass@k of the fresh model on its held-out Countdown set (transformers backend)."""
    from es_llm.backends.hf import HFBackend
    from es_llm.evaluate import metrics_from_rows, sample_and_score
    from es_llm.tasks import TaskConfig, build_task

    r = cfg.report
    task = build_task(TaskConfig(name="countdown", data=str(model_dir / "data" / "countdown_eval.jsonl")))
    try:
        params = SamplingParams(n=r.samples, temperature=r.temperature, max_tokens=r.max_tokens,
                                seed=cfg.seed)
        rows = sample_and_score(HFBackend(str(model_dir)), task, task.problems(), params, progress)
    finally:
        task.close()
    m = metrics_from_rows(rows, r.samples, bootstrap=200)
    top = f"pass@{r.samples}"
    return {"samples": r.samples, "temperature": r.temperature,
            "pass@1": m["pass@1"]["value"], top: m[top]["value"],
            "by_difficulty": m.get("by_difficulty", {})}


def _build_into(tmp: Path, cfg: TestbedConfig, progress: bool, echo) -> dict:
    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    sets, excluded = held_out_sets(cfg)
    for name, problems in sets.items():
        write_jsonl_atomic(tmp / "data" / f"{name}.jsonl", [_record(p) for p in problems])
    model = make_model(cfg, tokenizer)
    threads = torch.get_num_threads()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:
        stats = train(model, tokenizer, cfg, excluded, progress)
    finally:
        torch.set_num_threads(threads)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    train_s = time.perf_counter() - t0
    report = _report(tmp, cfg, progress)
    info = {"size": cfg.size, "fingerprint": cfg.fingerprint(), "parameters": _count_params(model),
            "train": stats, "build_s": round(train_s, 1),
            "held_out": {k: len(v) for k, v in sets.items()}, "report": report,
            "config": to_dict(cfg)}
    write_text_atomic(tmp / "testbed.yaml", dump_yaml(cfg))
    write_json_atomic(tmp / "testbed.json", info)
    return info


def build_testbed(cfg: TestbedConfig, out: str | Path | None = None, progress: bool = True,
                  echo=print) -> tuple[Path, dict]:
    """Build (or reuse from the cache) the testbed for ``cfg``; copy it to ``out`` if given.

    Returns the model folder and its ``testbed.json`` contents.
    """
    cached = cache_root() / f"{cfg.size}-{cfg.fingerprint()}"
    if (cached / "testbed.json").is_file():
        echo(f"testbed {cfg.size} found in cache: {cached}")
    else:
        echo(f"building testbed {cfg.size} (fingerprint {cfg.fingerprint()})")
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{cached.name}."))
        try:
            _build_into(tmp, cfg, progress, echo)
            replace_dir_atomic(tmp, cached)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    info = json.loads((cached / "testbed.json").read_text())
    target = cached
    if out is not None and Path(out).resolve() != cached.resolve():
        target = Path(out)
        staging = Path(tempfile.mkdtemp(dir=target.resolve().parent, prefix=f".{target.name}."))
        try:
            shutil.copytree(cached, staging, dirs_exist_ok=True)
            replace_dir_atomic(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target, info


def describe(path: Path, info: dict) -> str:
    r = info["report"]
    top = f"pass@{r['samples']}"
    lines = [f"testbed '{info['size']}' at {path}",
             f"  parameters {info['parameters']:,}  build {info['build_s']} s  "
             f"final loss {info['train']['final_loss']:.3f}",
             f"  held-out countdown: pass@1 {r['pass@1']:.3f}  {top} {r[top]:.3f} "
             f"(n={r['samples']}, T={r['temperature']})"]
    for tier, m in sorted(r.get("by_difficulty", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"    tier {tier}: pass@1 {m['pass@1']:.3f}  pass@{r['samples']} "
                     f"{m['pass@n']:.3f}  ({m['num_problems']} problems)")
    return "\n".join(lines)
