"""The testbed's weak pair for weak-to-strong distillation (the stronger teacher is
``build.pretrain`` with its own shape and schedule), with the student's tokenizer.

- ``weak_base`` / ``weak_rl``: a smaller model of the student's family, and the same model
  after a short REINFORCE run (group-mean baseline, binary task reward) on the held-out RL
  prompts. Their logit difference is the "what RL taught" direction W2S-OPD adds to the
  student.

This module is part of the weak pair's cache fingerprint, and every random
choice comes from a seeded stream of the testbed config.
"""

from __future__ import annotations

import random

import torch
from tqdm.auto import tqdm

from es_llm.backends.base import SamplingParams
from es_llm.testbed.config import TestbedConfig


def _pack(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int):
    """Right-padded ``[prompt ; completion]`` rows, their attention mask and a mask of the
    positions whose next token is a completion token (where the log-prob is taken)."""
    rows = [p + c for p, c in zip(prompt_ids, completion_ids)]
    B, L = len(rows), max(len(r) for r in rows)
    ids_B_L = torch.full((B, L), pad_id, dtype=torch.long)
    attn_B_L = torch.zeros((B, L), dtype=torch.long)
    scored_B_L = torch.zeros((B, L - 1))
    for i, (p, r) in enumerate(zip(prompt_ids, rows)):
        ids_B_L[i, :len(r)] = torch.tensor(r)
        attn_B_L[i, :len(r)] = 1
        scored_B_L[i, len(p) - 1:len(r) - 1] = 1
    return ids_B_L, attn_B_L, scored_B_L


def reinforce_loss(model, prompt_ids, completion_ids, adv_B: torch.Tensor, pad_id: int):
    """``-sum_b adv_b sum_t log pi(y_bt) / (completion tokens)``: the REINFORCE surrogate with
    the token count as the normaliser (constant per batch, so the gradient is unbiased)."""
    ids_B_L, attn_B_L, scored_B_L = _pack(prompt_ids, completion_ids, pad_id)
    logits_B_L_V = model(input_ids=ids_B_L, attention_mask=attn_B_L).logits[:, :-1]
    logp_B_L = logits_B_L_V.float().log_softmax(-1).gather(
        -1, ids_B_L[:, 1:, None]).squeeze(-1) * scored_B_L
    return -(adv_B[:, None] * logp_B_L).sum() / scored_B_L.sum().clamp(min=1)


def short_rl(model, tokenizer, task, problems: list, cfg: TestbedConfig, progress: bool) -> dict:
    """A short REINFORCE run of ``model`` on ``problems`` (``cfg.teachers.weak``'s schedule);
    returns the mean reward of the first and the last few steps."""
    from es_llm.backends import BackendSpec, make_backend

    w = cfg.teachers.weak
    rng = random.Random(f"{cfg.seed}:weak-rl")
    opt = torch.optim.AdamW(model.parameters(), lr=w.rl_lr, weight_decay=0.0)
    # The model being trained, in memory: each step samples its current weights.
    backend = make_backend(BackendSpec(None, backend="hf", model=model, tokenizer=tokenizer))
    rewards = []
    for step in tqdm(range(w.rl_steps), desc="weak rl", unit="step", disable=not progress):
        batch = rng.sample(problems, min(w.rl_prompts, len(problems)))
        prompt_ids = [tokenizer(p.prompt).input_ids for p in batch]
        params = SamplingParams(n=w.rl_group, temperature=1.0, max_tokens=cfg.report.max_tokens,
                                seed=rng.getrandbits(31))
        model.eval()
        outs = backend.generate(prompt_ids, params)
        scores = task.score_many([(p, c.text) for p, row in zip(batch, outs) for c in row])
        r_P_G = torch.tensor([s.reward for s in scores]).view(len(batch), w.rl_group)
        adv_B = (r_P_G - r_P_G.mean(dim=1, keepdim=True)).reshape(-1)
        rewards.append(float(r_P_G.mean()))
        model.train()
        comps = [list(c.token_ids) for row in outs for c in row]
        prompts = [p for p in prompt_ids for _ in range(w.rl_group)]
        keep = [i for i, c in enumerate(comps) if c and float(adv_B[i]) != 0.0]
        if not keep:
            continue
        loss = reinforce_loss(model, [prompts[i] for i in keep], [comps[i] for i in keep],
                              adv_B[keep], tokenizer.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    k = max(1, min(5, len(rewards) // 3))
    return {"rl_steps": w.rl_steps,
            "reward_first": sum(rewards[:k]) / k if rewards else None,
            "reward_last": sum(rewards[-k:]) / k if rewards else None}


def save_model(model, tokenizer, folder) -> None:
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def build_weak_pair(folder, cfg: TestbedConfig, pretrained, tokenizer, rl_task, rl_problems,
                    progress: bool) -> dict:
    """``folder/weak_base`` (``pretrained``: a smaller model pretrained like the student, and
    its stats) and ``folder/weak_rl`` (the same after ``short_rl``); returns build stats."""
    model, stats = pretrained
    save_model(model, tokenizer, folder / "weak_base")
    rl = short_rl(model, tokenizer, rl_task, rl_problems, cfg, progress)
    save_model(model, tokenizer, folder / "weak_rl")
    return {"weak_base": {"train": stats}, "weak_rl": {"train": stats, "rl": rl}}
