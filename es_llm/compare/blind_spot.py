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

The comparison section ``blind_spot`` (enabled by ``blind_spot.enabled``) is at the end.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import torch

from es_llm.backends.base import SamplingParams
from es_llm.backends.grafting import align_donor, check_layer, grafted, layer_activations
from es_llm.compare.config import BlindSpotConfig
from es_llm.compare.sampling import blind_spot_backend, compared_task
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, fields_dict,
                                    model_folder)
from es_llm.config import to_dict
from es_llm.errors import BadInput
from es_llm.metrics.coverage import overlap
from es_llm.report import (Figure, Heading, Paragraph, Table, number, pyplot, save_figure,
                           share)

CHAINS = ("greedy", "reorder", "reorder", "mean", "mix", "mix")
# Never-solved problems whose chains run in one batched generate call.
_PROBLEMS_PER_CALL = 32
KINDS = ("greedy", "reorder", "mean", "mix")
_NUMBERS = re.compile(r"^(.*?nums )((?:-?\d+ )+)(make .*)$", re.S)


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


# --- the section -------------------------------------------------------------------------------

def model_folders(inp: CheckInput) -> dict[str, Path]:
    """The model folder behind each compared model, checked for the blind spot: a causal
    decoder the HF backend serves, the layer in range, at least k samples per problem."""
    from transformers import AutoConfig

    from es_llm.backends.diffusion import is_diffusion_model

    cfg, loaded = inp.cfg, inp.loaded
    b = cfg.blind_spot
    if cfg.task.name != "countdown":
        raise BadInput(f"--blind-spot's reorder graft lists a Countdown problem's numbers in "
                       f"another order, so it needs task countdown (got {cfg.task.name!r}).")
    out = {}
    for src in inp.sources:
        name = src.name
        n = loaded[name].n if name in loaded else cfg.sampling.n
        if n < b.k:
            raise BadInput(f"--blind-spot needs at least blind_spot.k={b.k} samples per "
                           f"problem to find the never-solved ones, but {name} has n={n}; "
                           f"sample with --n {b.k} or more, or lower blind_spot.k.")
        folder = model_folder(inp, src, "--blind-spot runs")
        if is_diffusion_model(str(folder)):
            raise BadInput(f"--blind-spot grafts activations into a causal decoder's layers; "
                           f"{name} ({folder}) is a masked-diffusion model.")
        layers = getattr(AutoConfig.from_pretrained(folder), "num_hidden_layers", None)
        if not isinstance(layers, int) or not -layers <= b.layer < layers:
            raise BadInput(f"blind_spot.layer={b.layer} is out of range for {name}: it has "
                           f"{layers} decoder layers (0..{(layers or 1) - 1}, or negative "
                           f"from the end).")
        out[name] = folder
    return out


@dataclass(frozen=True)
class BlindSpot:
    """comparison.json["blind_spot"]: the settings and ``diagnose``'s figures per model."""

    config: dict
    models: dict[str, dict]

    def to_json(self) -> dict:
        return {"blind_spot": fields_dict(self)}


def compute(inp: SectionInput) -> BlindSpot:
    """Every model's ``diagnose``; ``inp.checked``: the model folders (``model_folders``)."""
    cfg, folders = inp.cfg, inp.checked
    task = compared_task(cfg, next(iter(folders.values())))
    try:
        problems = {p.id: p for p in task.problems()}
        models = {}
        for s in inp.sets:
            inp.echo(f"[compare] blind spot: {s.name}")
            models[s.name] = diagnose(blind_spot_backend(folders[s.name], cfg), task, problems, s,
                                      cfg.blind_spot, cfg.sampling.max_tokens, cfg.metrics_seed)
    finally:
        task.close()
    return BlindSpot(to_dict(cfg.blind_spot), models)


def figure(spot: dict, path: Path) -> str:
    """Per model: greedy alone and recovered by any chain, as % of its never-sampled
    problems."""
    plt = pyplot()
    names = list(spot["models"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(names) + 2), 4))
    for offset, key, label in ((-0.2, "greedy", "greedy alone"), (0.2, "recovered", "any chain")):
        ys = [100 * m[key] / m["diagnosed"] if m["diagnosed"] else np.nan
              for m in spot["models"].values()]
        ax.bar(x + offset, ys, 0.4, label=label)
    ax.set_xticks(x, [f"{n}\n({m['diagnosed']})" for n, m in spot["models"].items()])
    ax.set_ylabel("% of never-sampled problems solved")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """The pass@k blind spot: never-sampled problems that grafted greedy chains solve."""
    spot = comp["blind_spot"]
    c = spot["config"]
    out: list = [Heading(2, "The pass@k blind spot"), Paragraph(
        f"For each model, the problems none of its first {c['k']} samples solves, read again "
        f"by six deterministic chains: greedy, and greedy with activations grafted into the "
        f"output of decoder layer {c['layer']} over the prompt (two with the problem's numbers "
        f"in another order, coefficient {c['reorder_coef']:g}; one with the mean activation "
        f"of {c['reference_prompts']} prompts, {c['mean_coef']:g}; two with another problem's "
        f"prompt, {c['mix_coef']:g}). Recovered: solved by any chain. Tokens: generated by the "
        f"chains against the {c['k']} samples of the same problems. A high recovery says the "
        f"solutions were within the weights' reach but not sampled.")]
    rows = []
    for name, m in spot["models"].items():
        d = m["diagnosed"]
        rows.append([name, str(m["never_solved"]), str(d), share(m["greedy"], d),
                     share(m["recovered"], d)]
                    + [share(m["by_kind"][k], d) for k in ("reorder", "mean", "mix")]
                    + [f"{m['chain_tokens']:,} / {m['sample_tokens']:,}"])
    out.append(Table(["model", "never solved", "read", "greedy alone", "recovered", "reorder",
                      "mean", "mix", "tokens: chains / samples"], rows))
    pairs = list(next(iter(spot["models"].values()))["jaccard"])
    out.append(Table(["model"] + [f"Jaccard {p.replace('|', ' / ')}" for p in pairs],
                     [[name] + [number(m["jaccard"][p]) for p in pairs]
                      for name, m in spot["models"].items()]))
    out.append(Figure(figures["blind_spot"], "Share of each model's never-sampled problems "
                      "solved by greedy decoding alone and by any of the six chains."))
    return out


SECTIONS.register("blind_spot")(Section(
    place=40, enabled=lambda cfg: cfg.blind_spot.enabled, check=model_folders, compute=compute,
    blocks=blocks,
    figures=lambda comp, folder: {"blind_spot": figure(comp["blind_spot"],
                                                       folder / "blind_spot.png")}))
