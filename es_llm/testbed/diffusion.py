"""The testbed's masked-diffusion language model (LLaDA-style), trained on the student's
data mix with the student's tokenizer (its ``<mask>`` token is the diffusion mask).

The network is a bidirectional encoder that saves and loads with the Auto classes:
``BertForMaskedLM`` (learned absolute positions) by default, or ``ModernBertForMaskedLM``
(RoPE, GeGLU, pre-norm: closer to LLaDA's Llama-without-causal-mask). BERT is the default
because it learned to copy digits from the prompt far sooner at this size (95% vs 20% exact
on a two-number copy task after 400 steps; docs/benchmarks.md). A completion is a fixed
canvas of ``gen_length`` tokens after the prompt: the worked solution, then EOS up to the end
(LLaDA's SFT format), so the model learns where to stop.

Pretraining follows LLaDA's SFT recipe (Nie et al. 2025): per example draw ``t ~ U(eps, 1)``,
mask every canvas token independently with probability t (at least one), and predict the
masked tokens; the prompt is never masked. Departure: the loss is the plain mean of
``-log p(x_i | masked input)`` over all masked tokens of the batch, not LLaDA's
``sum / (t * gen_length)`` per row (the ELBO weighting). At this scale the 1/t weight's
variance (a row with t near eps weighs up to 1/eps) kept the models from learning to read
the prompt at all: on a two-number copy task, 400 steps reached 95% exact copies with the
plain mean and 0% with the 1/t weight (docs/benchmarks.md, "Diffusion testbed").

The source of this module and of the sampler is part of the diffusion model's cache key.
"""

from __future__ import annotations

import math
import random

import torch
from tqdm.auto import tqdm

from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.train import training_example


def _bert(m, tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(
        vocab_size=len(tokenizer), hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_positions, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True))


def _modernbert(m, tokenizer):
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    return ModernBertForMaskedLM(ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_positions, global_attn_every_n_layers=1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, cls_token_id=tokenizer.bos_token_id,
        sep_token_id=tokenizer.eos_token_id, mask_token_id=tokenizer.mask_token_id,
        tie_word_embeddings=True))


ENCODERS = {"bert": _bert, "modernbert": _modernbert}


def make_diffusion_model(cfg: TestbedConfig, tokenizer):
    """A randomly initialised masked LM of the configured architecture and shape."""
    m = cfg.diffusion.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return ENCODERS[m.arch](m, tokenizer)


def canvas_batch(examples: list[tuple[str, str]], tokenizer, gen_length: int):
    """Right-padded ``[prompt][completion + EOS fill][pad]`` rows: ids, attention mask and
    a boolean mask of the canvas positions (the only ones that are ever masked)."""
    rows = []
    for prompt, completion in examples:
        p = tokenizer(prompt).input_ids
        c = tokenizer(completion, add_special_tokens=False).input_ids
        rows.append((p, c + [tokenizer.eos_token_id] * (gen_length - len(c))))
    T = max(len(p) for p, _ in rows) + gen_length
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), T), dtype=torch.long)
    canvas = torch.zeros((len(rows), T), dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + gen_length] = torch.tensor(p + c)
        attention[i, :len(p) + gen_length] = 1
        canvas[i, len(p):len(p) + gen_length] = True
    return ids, attention, canvas


def masked_diffusion_loss(model, ids_B_T, attention_B_T, canvas_B_T, mask_id: int,
                          generator: torch.Generator, eps: float = 1e-3):
    """The masked-token cross-entropy of one batch (see the module docstring); a scalar."""
    B = ids_B_T.shape[0]
    t_B = eps + (1 - eps) * torch.rand(B, generator=generator)
    masked_B_T = (torch.rand(ids_B_T.shape, generator=generator) < t_B[:, None]) & canvas_B_T
    # At least one masked token per row: the first canvas position when the draw gave none.
    none_B = ~masked_B_T.any(dim=-1)
    first_B = canvas_B_T.float().argmax(dim=-1)
    masked_B_T[none_B, first_B[none_B]] = True
    noisy_B_T = torch.where(masked_B_T, torch.full_like(ids_B_T, mask_id), ids_B_T)
    logits = model(input_ids=noisy_B_T, attention_mask=attention_B_T).logits
    nll_B_T = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), ids_B_T,
                                                reduction="none")
    return (nll_B_T * masked_B_T).sum() / masked_B_T.sum()


def fits(completion: str, tokenizer, gen_length: int) -> bool:
    """A training completion needs room for at least one EOS in the canvas."""
    return len(tokenizer(completion, add_special_tokens=False).input_ids) < gen_length


def train_diffusion(model, tokenizer, cfg: TestbedConfig, excluded: set, progress: bool = True) -> dict:
    """Masked-diffusion pretraining with AdamW and a warmup + cosine schedule."""
    d = cfg.diffusion
    t = d.train
    gen_length = d.sampling.gen_length
    rng = random.Random(f"{cfg.seed}:diffusion-train")
    generator = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr, weight_decay=t.weight_decay,
                            betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < t.warmup_steps:
            return t.lr * (step + 1) / t.warmup_steps
        frac = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
        return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    def example():
        while True:
            prompt, completion = training_example(rng, cfg, excluded)
            if fits(completion, tokenizer, gen_length):
                return prompt, completion

    model.train()
    losses = []
    bar = tqdm(range(t.steps), desc="pretrain[diffusion]", unit="step", disable=not progress)
    for step in bar:
        ids, attention, canvas = canvas_batch([example() for _ in range(t.batch_size)],
                                              tokenizer, gen_length)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = masked_diffusion_loss(model, ids, attention, canvas, tokenizer.mask_token_id,
                                     generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
    model.eval()
    return {"final_loss": sum(losses[-100:]) / len(losses[-100:]), "steps": t.steps}
