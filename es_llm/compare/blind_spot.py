"""The pass@k blind spot: of the problems a model never solves in k samples, how many it
solves when its greedy decoding is nudged from inside.

Zhou et al. ("Hard or just unreached?", arXiv 2606.19636) found that 10-23% of the problems
no sampling seed solves in six tries are solved at matched compute by greedy decoding plus
five residual-stream perturbations grafted into the forward pass, while greedy alone solves
at most 6% of them. Here, for each model and each problem none of its first k samples
solves (U), six deterministic chains run: greedy, and greedy with one graft each at one
decoder layer over the prompt's positions (``es_llm.backends.grafting``):

- ``reorder`` (two chains): the activations of the same problem with its numbers listed in
  another order (Countdown prompts), replacing the model's own (coefficient 1 by default);
- ``mean`` (one): the mean activation over a reference batch of prompts, mixed in;
- ``mix`` (two): another problem's prompt activations at a small coefficient.

Reported per model: |U|, greedy alone, recovered by any chain (at the chain count of k = 6
samples, and beside them the tokens the chains and the samples generated), each kind's fix
set and the pairwise Jaccard of the fix sets. For ES (which itself searches by perturbing
the model) against RL, a high recovery means solutions are latent in the weights but not
reached by sampling; a low one that the problems are out of reach.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from itertools import combinations

import torch

from es_llm.backends.base import SamplingParams
from es_llm.backends.grafting import align_donor, check_layer, grafted, layer_activations
from es_llm.errors import BadInput
from es_llm.metrics.coverage import overlap
from populations.numbers import is_finite_number

CHAINS = ("greedy", "reorder", "reorder", "mean", "mix", "mix")
# Never-solved problems whose chains run in one batched generate call.
_PROBLEMS_PER_CALL = 32
KINDS = ("greedy", "reorder", "mean", "mix")
_NUMBERS = re.compile(r"^(.*?nums )((?:-?\d+ )+)(make .*)$", re.S)


@dataclass(frozen=True)
class BlindSpotConfig:
    # The pass@k blind spot (es_llm/compare/blind_spot.py): for each model folder, the
    # problems none of its first k samples solves, read again by greedy decoding and five
    # grafted greedy chains.
    enabled: bool = False
    # Sampled tries that define a never-solved problem (the first k of each problem's).
    k: int = 6
    # Decoder layer whose output is grafted; negative counts from the end (-1 = the last).
    layer: int = 0
    # Coefficients of the three graft kinds (0 = no change, 1 = the donor replaces).
    reorder_coef: float = 1.0
    mean_coef: float = 0.5
    mix_coef: float = 0.1
    # Prompts of the compared set whose mean activation is the mean graft's donor.
    reference_prompts: int = 32
    # At most this many never-solved problems per model are read (null = all of them).
    max_problems: int | None = None

    def __post_init__(self):
        if self.k < 1:
            raise BadInput(f"blind_spot.k must be at least 1, got {self.k}.")
        for name in ("reorder_coef", "mean_coef", "mix_coef"):
            value = getattr(self, name)
            if not (is_finite_number(value) and 0 <= value <= 1):
                raise BadInput(f"blind_spot.{name} must lie in [0, 1], got {value!r}.")
        if self.reference_prompts < 1:
            raise BadInput(f"blind_spot.reference_prompts must be at least 1, got "
                           f"{self.reference_prompts}.")
        if self.max_problems is not None and self.max_problems < 1:
            raise BadInput(f"blind_spot.max_problems must be at least 1 or null, got "
                           f"{self.max_problems}.")


def reordered(prompt: str, rng: random.Random) -> str:
    """The Countdown prompt with its numbers in another order (the same order only when
    every order is the same); ValueError for a prompt without a ``nums ... make`` list."""
    m = _NUMBERS.match(prompt)
    if m is None:
        raise ValueError(f"not a Countdown prompt (no 'nums ... make' list): {prompt[:60]!r}")
    numbers = m.group(2).split()
    order = numbers[:]
    for _ in range(20):
        rng.shuffle(order)
        if order != numbers:
            break
    return f"{m.group(1)}{' '.join(order)} {m.group(3)}"


def _donors(model, tokenizer, prompts: list[str], i: int, ids: list[int], mean_H: torch.Tensor,
            layer: int, cfg: BlindSpotConfig, seed: int) -> tuple[torch.Tensor, list[float]]:
    """``(donors_B_T_H, coef_B)`` of problem ``i``'s six chains (``ids``: its prompt's
    token ids)."""
    T = len(ids)
    own = layer_activations(model, ids, layer)
    rows, coefs = [], []
    for j, kind in enumerate(CHAINS):
        if kind == "greedy":
            rows.append(own)
            coefs.append(0.0)
        elif kind == "reorder":
            text = reordered(prompts[i], random.Random(f"{seed}:reorder:{i}:{j}"))
            rows.append(align_donor(layer_activations(model, tokenizer(text).input_ids, layer), T))
            coefs.append(cfg.reorder_coef)
        elif kind == "mean":
            rows.append(mean_H[None].expand(T, -1))
            coefs.append(cfg.mean_coef)
        else:
            other = prompts[(i + j) % len(prompts)]
            rows.append(align_donor(layer_activations(model, tokenizer(other).input_ids, layer),
                                    T))
            coefs.append(cfg.mix_coef)
    return torch.stack(rows), coefs


def diagnose(backend, task, problems: dict, sample_set, cfg: BlindSpotConfig, max_tokens: int,
             seed: int = 0) -> dict:
    """The blind-spot figures of one model (``backend``: its ``HFBackend``)."""
    model, tok = backend.model, backend.tokenizer
    layer = check_layer(model, cfg.layer)
    prompts = list(sample_set.prompts)
    never = [i for i, c in enumerate(sample_set.correct) if not c[:cfg.k].any()]
    chosen = never[:cfg.max_problems] if cfg.max_problems else never
    reference = [layer_activations(model, tok(p).input_ids, layer)
                 for p in prompts[:cfg.reference_prompts]]
    mean_H = torch.cat(reference).mean(0)
    fixed = {kind: set() for kind in KINDS}
    chain_tokens = sample_tokens = 0
    params = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
    # Problems whose prompts have the same length share one generate call (no padding, so
    # a graft's positions are the same in every row).
    prompt_ids = {i: tok(prompts[i]).input_ids for i in chosen}
    by_length: dict[int, list[int]] = {}
    for i in chosen:
        by_length.setdefault(len(prompt_ids[i]), []).append(i)
    for T, group in sorted(by_length.items()):
        for start in range(0, len(group), _PROBLEMS_PER_CALL):
            part = group[start:start + _PROBLEMS_PER_CALL]
            made = [_donors(model, tok, prompts, i, prompt_ids[i], mean_H, layer, cfg, seed)
                    for i in part]
            donors = torch.cat([d for d, _ in made])
            coefs = [c for _, cs in made for c in cs]
            with grafted(model, layer, donors, coefs, slice(0, T)):
                outs = backend.generate([prompts[i] for i in part for _ in CHAINS], params)
            for n, i in enumerate(part):
                pid = sample_set.problem_ids[i]
                mine = outs[n * len(CHAINS):(n + 1) * len(CHAINS)]
                scores = task.score_many([(problems[pid], o[0].text) for o in mine])
                for kind, score in zip(CHAINS, scores):
                    if score.correct:
                        fixed[kind].add(pid)
                chain_tokens += sum(len(o[0].token_ids) for o in mine)
                sample_tokens += sum(len(tok(t, add_special_tokens=False).input_ids)
                                     for t in sample_set.texts[i][:cfg.k])
    recovered = set().union(*fixed.values())
    return {"model": sample_set.name, "k": cfg.k, "layer": layer, "chains": len(CHAINS),
            "never_solved": len(never), "diagnosed": len(chosen),
            "greedy": len(fixed["greedy"]), "recovered": len(recovered),
            "by_kind": {kind: len(ids) for kind, ids in fixed.items()},
            "fix_sets": {kind: sorted(ids) for kind, ids in fixed.items()},
            # None where neither kind fixed anything (no overlap to speak of).
            "jaccard": {f"{a}|{b}": (overlap(fixed[a], fixed[b])["jaccard"]
                                     if fixed[a] | fixed[b] else None)
                        for a, b in combinations(KINDS, 2)},
            "chain_tokens": chain_tokens, "sample_tokens": sample_tokens}
