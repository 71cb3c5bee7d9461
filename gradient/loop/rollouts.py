"""Rollouts of one training step: draw prompts, sample G completions each, score them.

Rows are prompt-major (row = p * G + g). Everything a rollout needs later is fixed here, at
its birth: the exact token ids the engine was fed and produced, the engine's log-probs of
the sampled tokens, the reward. With AdaPrefix the given part of the reference solution is
appended to the prompt ids (so it is never in the loss) and the reward judges the whole
attempt, prefix plus completion.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from es_llm.backends.base import SamplingParams
from gradient.config import GRPORunConfig
from gradient.dllm.estimators import estimator_spec
from gradient.loop.seeds import derive_seed
from gradient.maths import adaprefix, dapo


@dataclass
class Groups:
    """P prompts x G rollouts."""

    problems: list
    prompt_ids: list[list[int]] = field(default_factory=list)        # B rows
    completion_ids: list[list[int]] = field(default_factory=list)    # B rows
    engine_logp: list[list[float]] = field(default_factory=list)     # B rows
    rewards_P_G: torch.Tensor = None      # float64, after overlong shaping
    correct_P_G: torch.Tensor = None      # bool
    truncated_P_G: torch.Tensor = None    # bool: stopped by max_tokens
    too_long_P_G: torch.Tensor = None     # bool: beyond task.max_completion_chars, unread
    prefix_P: list[float] = field(default_factory=list)              # fraction given
    # What a diffusion sampler saw per row (DiffusionTrace), None for autoregressive rows.
    traces: list = field(default_factory=list)                       # B rows

    @property
    def group_size(self) -> int:
        return self.rewards_P_G.shape[1]

    def select(self, keep: torch.Tensor) -> "Groups":
        """The groups at the indices ``keep`` (ascending), rows kept together."""
        G = self.group_size
        ps = keep.tolist()
        rows = [p * G + g for p in ps for g in range(G)]
        return Groups(problems=[self.problems[p] for p in ps],
                      prompt_ids=[self.prompt_ids[r] for r in rows],
                      completion_ids=[self.completion_ids[r] for r in rows],
                      engine_logp=[self.engine_logp[r] for r in rows],
                      rewards_P_G=self.rewards_P_G[keep], correct_P_G=self.correct_P_G[keep],
                      truncated_P_G=self.truncated_P_G[keep],
                      too_long_P_G=self.too_long_P_G[keep],
                      prefix_P=[self.prefix_P[p] for p in ps],
                      traces=[self.traces[r] for r in rows])

    @staticmethod
    def concat(parts: list["Groups"], group_size: int) -> "Groups":
        def cat(name):
            tensors = [getattr(g, name) for g in parts]
            return torch.cat(tensors) if tensors else torch.zeros((0, group_size))
        return Groups(problems=[p for g in parts for p in g.problems],
                      prompt_ids=[r for g in parts for r in g.prompt_ids],
                      completion_ids=[r for g in parts for r in g.completion_ids],
                      engine_logp=[r for g in parts for r in g.engine_logp],
                      rewards_P_G=cat("rewards_P_G"), correct_P_G=cat("correct_P_G").bool(),
                      truncated_P_G=cat("truncated_P_G").bool(),
                      too_long_P_G=cat("too_long_P_G").bool(),
                      prefix_P=[f for g in parts for f in g.prefix_P],
                      traces=[t for g in parts for t in g.traces])


def draw_problems(problems: list, cfg: GRPORunConfig, step: int, round_: int) -> list:
    """The prompts of a step's generation round: a seeded sample without replacement, so a
    resumed run draws what the uninterrupted one would have (the data position is the step)."""
    rng = random.Random(f"{cfg.seed}:grpo-batch:{step}:{round_}")
    return rng.sample(problems, min(cfg.rollout.prompts_per_step, len(problems)))


def generate_groups(edges, problems: list, cfg: GRPORunConfig, step: int, round_: int,
                    prefix_state, prefix_cfg) -> Groups:
    """Sample G rollouts for each problem and score them."""
    r, tok = cfg.rollout, edges.tokenizer
    prompts, prefix_texts, fractions = [], [], []
    for p in problems:
        ids = list(tok(p.prompt).input_ids)
        given: list[int] = []
        frac = 0.0
        if prefix_cfg is not None:
            frac = adaprefix.fraction(prefix_state, prefix_cfg, p.id, step)
            ref_ids = tok(p.meta["reference"], add_special_tokens=False).input_ids
            given = list(ref_ids[:adaprefix.prefix_tokens(ref_ids, frac)])
        prompts.append(ids + given)
        prefix_texts.append(tok.decode(given) if given else "")
        fractions.append(frac)
    # A diffusion sampler reports no log-probs; its trainer estimates them from the trace.
    diffusion = estimator_spec(cfg.algo.dllm.estimator).diffusion
    params = SamplingParams(n=r.group_size, temperature=r.temperature, top_p=r.top_p,
                            max_tokens=r.max_tokens, seed=derive_seed(cfg.seed, step, round_),
                            logprobs=not diffusion)
    out = edges.backend.generate(prompts, params, keys=[p.id for p in problems])
    pairs = [(p, prefix_texts[i] + c.text) for i, p in enumerate(problems) for c in out[i]]
    scores = edges.task.score_many(pairs)
    flat = [c for row in out for c in row]
    P, G = len(problems), r.group_size
    rewards_P_G = torch.tensor([s.reward for s in scores], dtype=torch.float64).view(P, G)
    if cfg.algo.overlong.enabled:
        o = cfg.algo.overlong
        lengths_B = torch.tensor([len(c.token_ids) for c in flat])
        rewards_P_G = rewards_P_G + dapo.overlong_penalty(
            lengths_B, r.max_tokens, o.buffer_len, o.penalty_factor).view(P, G).double()
    return Groups(problems=list(problems),
                  prompt_ids=[prompts[i] for i in range(P) for _ in range(G)],
                  completion_ids=[list(c.token_ids) for c in flat],
                  engine_logp=[list(c.logprobs) if c.logprobs is not None else None
                               for c in flat],
                  rewards_P_G=rewards_P_G,
                  correct_P_G=torch.tensor([s.correct for s in scores]).view(P, G),
                  truncated_P_G=torch.tensor([c.finish_reason == "length"
                                              for c in flat]).view(P, G),
                  too_long_P_G=torch.tensor([s.too_long for s in scores]).view(P, G),
                  prefix_P=fractions,
                  traces=[c.trace for c in flat])


def collect(edges, problems: list, cfg: GRPORunConfig, step: int, prefix_state, prefix_cfg):
    """The step's groups, DAPO's dynamic sampling applied when on; returns
    ``(groups, prefix_state, metrics)``. Metrics describe everything generated, dropped
    groups included; ``samples/generated`` counts every rollout sampled and
    ``tokens/iteration`` every token they generated."""
    ds = cfg.algo.dynamic_sampling
    rounds = ds.max_gen_batches if ds.enabled else 1
    G, wanted = cfg.rollout.group_size, cfg.rollout.prompts_per_step
    seen = []
    for round_ in range(rounds):
        groups = generate_groups(edges, draw_problems(problems, cfg, step, round_), cfg, step,
                                 round_, prefix_state, prefix_cfg)
        seen.append(groups)
        if prefix_cfg is not None:
            for p, correct_G in zip(groups.problems, groups.correct_P_G):
                prefix_state = adaprefix.update(prefix_state, prefix_cfg, p.id,
                                                float(correct_G.sum()), G)
        every = Groups.concat(seen, G)
        # Dynamic sampling: the first groups with a reward spread, another round while fewer
        # than the step's prompts have one.
        keep = (dapo.keep_groups(every.rewards_P_G, wanted) if ds.enabled
                else torch.arange(len(every.problems)))
        if len(keep) >= wanted:
            break
    out = every.select(keep)
    lengths = torch.tensor([len(c) for c in every.completion_ids], dtype=torch.float64)
    metrics = {
        "reward/mean": float(every.rewards_P_G.mean()),
        "reward/std": float(every.rewards_P_G.std()),
        "reward/correct": float(every.correct_P_G.double().mean()),
        "reward/frac_zero_std": float(dapo.zero_variance_groups(every.rewards_P_G).double().mean()),
        "rollout/len_mean": float(lengths.mean()),
        "rollout/truncated": float(every.truncated_P_G.double().mean()),
        "rollout/too_long": float(every.too_long_P_G.sum()),
        "rollout/gen_rounds": float(len(seen)),
        "rollout/groups_kept": float(len(out.problems)),
        "samples/step": float(lengths.numel()),
        "tokens/iteration": float(lengths.sum()),
    }
    if prefix_cfg is not None:
        metrics["prefix/fraction_mean"] = sum(every.prefix_P) / max(1, len(every.prefix_P))
    return out, prefix_state, metrics
