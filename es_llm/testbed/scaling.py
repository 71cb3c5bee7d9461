"""What the pretraining-to-post-training study measures on a testbed build, beside the build
itself: the loss on a held-out stream, the tokens pretraining read, the worked traces of the
SFT stage, and the base model's probability of each held-out problem's reference answer.

A build of the study is an ordinary testbed build (cached under its own key) whose model
shape and pretraining steps vary: the student for Countdown, the ``chess`` domain model for
chess. The **held-out stream** is fresh draws from the build's own training distribution
(the student's mix, or the domain's generator) on a random stream of its own, the held-out
problems excluded as in training; its loss is the mean negative log-likelihood per scored
token (completion and EOS, as in training). The **tokens pretraining read** are estimated as
steps x batch size x the stream's mean tokens per example (prompt, completion and the special
tokens), since the training loop counts steps, not tokens.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from es_llm.errors import BadInput
from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.train import (_countdown_example, _problem_key, completion_batch,
                                  held_out_sets, training_example)

# Study domains and the testbed folder their model lives in ("" = the student itself).
DOMAINS = {"countdown": "", "chess": "chess"}


def check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise BadInput(f"domain {domain!r} has no held-out set a study can evaluate on; valid "
                       f"domains are: {', '.join(DOMAINS)}.")


def stream(domain: str, cfg: TestbedConfig) -> Callable[[random.Random], tuple[str, str]]:
    """``draw(rng)``: one (prompt, completion) example of the build's training distribution,
    never a held-out problem, drawn afresh (a chess build's pre-drawn pool is not used)."""
    check_domain(domain)
    if domain == "countdown":
        _, excluded = held_out_sets(cfg)
        return lambda rng: training_example(rng, cfg, excluded)
    from es_llm.testbed.domains import example_stream, held_out

    _, excluded = held_out(domain, cfg)
    fresh = replace(cfg, **{domain: replace(getattr(cfg, domain), pool_per_tier=0)})
    return example_stream(domain, fresh, excluded, progress=False)


@torch.no_grad()
def heldout_loss(model, tokenizer, draw, count: int, seed: int,
                 batch_size: int = 64) -> tuple[float, float]:
    """``(loss per scored token, tokens per example)`` on ``count`` examples of ``draw`` from
    the stream ``seed`` (the loss the build's training minimised, on examples it was not
    trained on as drawn)."""
    rng = random.Random(f"{seed}:held-out-stream")
    examples = [draw(rng) for _ in range(count)]
    total, scored, tokens = 0.0, 0, 0
    model.eval()
    for start in range(0, count, batch_size):
        ids, labels = completion_batch(examples[start:start + batch_size], tokenizer)
        mask = (ids != tokenizer.pad_token_id).long()
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        target = labels[:, 1:]
        keep = target != -100
        logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
        total -= float(logp[keep].sum())
        scored += int(keep.sum())
        tokens += int(mask.sum())
    return total / max(scored, 1), tokens / max(count, 1)


def sft_traces(cfg: TestbedConfig, count: int, seed: int) -> list[dict]:
    """``count`` clean worked Countdown traces (prompt, completion) of the build's tiers, no
    held-out problem among them: the SFT stage's data."""
    _, excluded = held_out_sets(cfg)
    rng, rows, data = random.Random(f"{seed}:sft-traces"), [], cfg.data
    while len(rows) < count:
        tier = rng.choices(data.countdown_tiers, weights=data.countdown_weights)[0]
        problem, completion = _countdown_example(rng, tier, data)
        if _problem_key(problem) not in excluded:
            rows.append({"prompt": problem.prompt, "completion": completion})
    return rows


def reference_logprobs(model_dir: Path, problems: list, batch_size: int = 64) -> list[float]:
    """The base model's log-probability of each problem's reference completion (its
    ``meta["reference"]``: the worked solution, or the chess move in answer tags) and the
    EOS after it, given the prompt."""
    from es_llm.testtime.generations import HFScorer

    scorer = HFScorer(str(model_dir), batch_size=batch_size)
    eos = scorer.tokenizer.eos_token
    per_token = scorer.token_logprobs([p.prompt for p in problems],
                                      [p.meta["reference"] + eos for p in problems])
    return [float(sum(lp)) for lp in per_token]
