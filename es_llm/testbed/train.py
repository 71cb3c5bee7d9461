"""What the testbed model is made of: held-out problem sets, the training mix, the model,
and the pretraining loop.

Everything is a pure function of the ``TestbedConfig`` (seeded ``random.Random`` streams
for data, a seeded torch generator for initialisation). The source of this module is part
of the build's cache fingerprint; plumbing that does not change the model lives in
``build.py``.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from es_llm.errors import BadInput
from es_llm.tasks import arithmetic, countdown
from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.habits import with_habits


def _problem_key(problem) -> str:
    g = problem.gold
    if isinstance(g, dict) and "numbers" in g:
        return f"cd:{sorted(g['numbers'])}:{g['target']}"
    return f"ar:{problem.prompt}"


def _countdown_example(rng: random.Random, tier: int, data) -> tuple:
    return countdown.generate(rng, tier, max_number=data.countdown_max_number,
                              max_target=data.countdown_max_target)


def _distinct(draw, count: int, seen: set, what: str, strict: bool = True) -> list:
    """``count`` problems from ``draw()`` whose keys are not in ``seen`` (which grows); with
    ``strict=False`` as many as 200 draws per wanted problem find, without an error."""
    problems, tries = [], 0
    while len(problems) < count:
        tries += 1
        if tries > 200 * count and not strict:
            break
        if tries > 200 * count:
            raise BadInput(f"could not draw {count} distinct held-out {what} problems (found "
                           f"{len(problems)}); the tier's problem space is too small: lower "
                           f"data.eval_per_tier / data.rl_per_tier or widen the number range.")
        problem, completion = draw()
        key = _problem_key(problem)
        if key not in seen:
            seen.add(key)
            # The worked completion travels with the problem as its reference solution
            # (prefix-guided RL gives a part of it); the model never trains on it.
            problems.append(replace(problem, meta={**problem.meta, "reference": completion}))
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
    if data.rl_pool_per_tier:
        # Its own RNG and a copy of `seen`: the pool changes neither the sets above nor what
        # pretraining excludes, so the model is the same with or without it.
        pool_rng, taken, problems = random.Random(f"{cfg.seed}:rl-pool"), set(seen), []
        for tier in data.countdown_tiers:
            problems += _distinct(lambda: _countdown_example(pool_rng, tier, data),
                                  data.rl_pool_per_tier, taken, f"countdown tier-{tier}",
                                  strict=False)
        sets["countdown_rl_pool"] = _renumber(problems, "countdown-rl-pool")
    return sets, seen


def _renumber(problems, prefix):
    return [replace(p, id=f"{prefix}-{i:05d}") for i, p in enumerate(problems)]


def record(problem) -> dict:
    rec = {"id": problem.id, "prompt": problem.prompt, "difficulty": problem.difficulty}
    if isinstance(problem.gold, dict):
        rec.update(problem.gold)
    else:
        rec["answer"] = problem.gold
    rec.update({k: problem.meta[k] for k in ("solution", "reference") if k in problem.meta})
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
            if _problem_key(problem) in excluded:
                continue
            # Decided after the check, so held-out problems do not skew the habits' shares;
            # a slip makes a problem of its own, which is checked again below.
            problem, completion = with_habits(rng, *data.habit_rates(tier), problem,
                                              completion, data.countdown_max_target)
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


def completion_batch(examples: list[tuple[str, str]], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
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


def train(model, tokenizer, cfg: TestbedConfig, excluded: set, progress: bool = True,
          draw=None) -> dict:
    """Next-token pretraining on completions with AdamW and a cosine schedule.

    ``draw(rng)`` gives one (prompt, completion) example; the default is the student's mix
    (``training_example``). Domain models pass their own.
    """
    t = cfg.train
    draw = draw or (lambda r: training_example(r, cfg, excluded))
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
        ids, labels = completion_batch([draw(rng) for _ in range(t.batch_size)], tokenizer)
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
