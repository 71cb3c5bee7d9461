"""Full-rank ES as the shortest loop over a vLLM engine: the baseline es-llm's engine is timed
against (``scripts/bench_es.py``, item 10).

One iteration, mirrored pairs, z-scored fitness, plain ascent (es-llm's defaults):

    for each direction d: eps = keyed noise of d for every tensor
        for sign s in (+1, -1): write theta + s * sigma * eps, generate greedily, score
    write theta back
    theta += lr * sum_d c_d eps_d,  c_d = (w(+d) - w(-d)) / N,  w = z-scores of fitness

The weights go into the engine through ``collective_rpc("es_write")``, the worker extension
every es-llm vLLM engine has (``es_llm/backends/vllm_weights.py``): vLLM's CPU backend packs
its linear layers and drops their plain tensors, so a plain in-place ``add_`` has nothing to
add to. Noise is es-llm's keyed noise of each HF tensor name (``populations.noise``), so the
same rewards give the same update as es-llm's (``tests/test_plain_vllm_es.py``). Everything
else es-llm does (its fp32 master behind an HF copy of the model, the ledger, metrics,
checks, ranks) is left out.
"""

from __future__ import annotations

from typing import Callable

import torch

from populations.noise import gaussian, noise_key

# (completion texts of every prompt) -> reward of each
Score = Callable[[list[str]], list[float]]


def member_rewards(llm, tensors: dict[str, torch.Tensor], prompts: list[str], score: Score,
                   max_tokens: int) -> list[float]:
    """Write ``tensors`` (HF names) into the engine, generate greedily, score."""
    from vllm import SamplingParams

    llm.collective_rpc("es_write", args=(tensors,))
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                        use_tqdm=False)
    return score([o.outputs[0].text for o in outs])


def iteration(llm, theta: dict[str, torch.Tensor], prompts: list[str], score: Score, *,
              seed: int, step: int, population: int, sigma: float, lr: float,
              max_tokens: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One ES iteration from fp32 ``theta`` (HF names); returns the new theta and the
    rewards (N, P), row 2d + 0 for +eps_d and 2d + 1 for -eps_d."""
    def eps(d: int, name: str) -> torch.Tensor:
        return gaussian(noise_key(seed, step, d, name), theta[name].shape)

    rows = []
    for d in range(population // 2):
        noise = {k: eps(d, k) for k in theta}
        for s in (1, -1):
            member = {k: v + (s * sigma) * noise[k] for k, v in theta.items()}
            rows.append(member_rewards(llm, member, prompts, score, max_tokens))
    llm.collective_rpc("es_write", args=(theta,))
    rewards = torch.tensor(rows, dtype=torch.float64)
    f = rewards.mean(dim=1)
    w = torch.zeros_like(f) if f.max() == f.min() else (f - f.mean()) / (f.std(correction=0)
                                                                        + 1e-8)
    coefs = [(d, float(w[2 * d] - w[2 * d + 1]) / population) for d in range(population // 2)]
    new = {}
    for k, v in theta.items():
        g = torch.zeros_like(v)
        for d, c in coefs:
            if c != 0.0:
                g.add_(eps(d, k), alpha=c)
        new[k] = v + lr * g
    return new, rewards
