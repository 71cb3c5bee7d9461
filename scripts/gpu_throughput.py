"""ES throughput against plain batched generation on one model, one device; one JSON line.

    python scripts/gpu_throughput.py --model runs/standin-0.5b --device cuda --dtype bfloat16

Run by ``scripts/gpu_check.py`` once per model, each in a fresh process so one model's peak
GPU memory does not carry into the next. All on the HF backend (no vLLM), greedy,
``TOKENS`` new tokens per row; each setting of ``SETTINGS`` is timed once, after one
warm-up call, beside plain batched generation of the same rows in the same calls (the same
model, no member terms, no written weights):

* ``full_rank``: full-rank ES, ``FULL_MEMBERS`` mirrored members, each member's weights
  written (engine.serve=weights) and then its 64 prompts generated in one call;
* ``rows_n256`` / ``rows_n4096``: low-rank ES (es.kind=lowrank, rank 4) served as per-row
  terms (engine.serve=rows, es_llm/backends/lowrank_rows.py), N = 256 / 4,096 members, 4
  prompts per mirrored pair, 64 / 256 members (256 / 1,024 rows) per generate call.

Per setting and side: samples, generated tokens, seconds, samples/s, tokens/s and
``torch.cuda.max_memory_allocated`` since the side started (null on the CPU). Noise and
factors are drawn on ``--device``.

Time on one H200 (the budget is 8 minutes for all of ``scripts/gpu_check.sh``): per model,
generate calls of 33 forward passes (prefill + 32 tokens): full rank 4 + 4 (plain + ES),
N = 256 4 + 4, N = 4,096 16 + 16, plus 3 warm-ups: 51 calls, 1,683 forward passes. The one
GPU measurement recorded (docs/benchmarks.md, H200, Qwen2.5-0.5B's shape, HF backend) took
1,493 ms for 64 rows x 64 tokens, 23 ms a step; at that rate a model takes 39 s. Allowing
2x per step for the row terms' extra products and the 1,024-row calls, and another 2x at
1.5B (28 wider layers): 39 x 2 = 78 s at 0.5B and 39 x 4 = 156 s at 1.5B, 234 s of
generation, plus about 30 s of loading (3 loads per model): under 4.5 minutes, leaving 3.5
for the stages and the gpu-marked tests. The estimate is not yet checked on a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys

import torch

from bench_es import full_rank_of, lowrank_cfg, member_rows, plain_batched, setup_of, timed
from es_llm.errors import BadInput
from es_llm.es.engine import evaluate_members, member_sampling

TOKENS = 32
FULL_MEMBERS = 4
# Each setting's population, prompts per mirrored pair and members per generate call (full
# rank: one member per call, whatever members_per_call says; it only has to be valid).
SETTINGS = {"full_rank": {"population": FULL_MEMBERS, "prompts_per_member": 64,
                          "members_per_call": 2, "full": True},
            "rows_n256": {"population": 256, "prompts_per_member": 4,
                          "members_per_call": 64, "full": False},
            "rows_n4096": {"population": 4096, "prompts_per_member": 4,
                           "members_per_call": 256, "full": False}}


def measured(fn, samples: int) -> dict:
    """One timed call of ``fn`` (which returns the tokens it generated): its rates and the
    peak GPU memory since it started."""
    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    tokens = []
    seconds = timed(lambda: tokens.append(fn()), 1)
    return {"samples": samples, "tokens": tokens[0], "seconds": round(seconds, 3),
            "samples_per_s": samples / seconds, "tokens_per_s": tokens[0] / seconds,
            "peak_gpu_bytes": (torch.cuda.max_memory_allocated()
                               if torch.cuda.is_initialized() else None)}


def setting_throughput(model: str, device: str, dtype: str, setting: dict) -> dict:
    """One setting: plain batched generation and ES on the same rows, in the same calls."""
    args = argparse.Namespace(device=device, dtype=dtype, noise_device=device, rank=4,
                              max_tokens=TOKENS, prompts_per_member=setting["prompts_per_member"],
                              members_per_call=setting["members_per_call"])
    cfg = lowrank_cfg(model, args, setting["population"])
    cfg = full_rank_of(cfg) if setting["full"] else cfg
    edges, state, members, batch = setup_of(cfg)
    params = member_sampling(cfg)
    rows = member_rows(cfg, members, batch)
    members_per_call = 1 if setting["full"] else cfg.engine.members_per_call
    per_call = members_per_call * cfg.engine.prompts_per_member
    try:
        plain_batched(edges.backend, rows[:per_call], params, per_call)  # warm up
        plain = measured(lambda: sum(len(c.token_ids) for c in plain_batched(
            edges.backend, rows, params, per_call)), len(rows))
        es = measured(lambda: sum(s[5] for s in evaluate_members(
            edges, state, members, batch, cfg).values()), len(rows))
    finally:
        edges.task.close()
        edges.backend.close()
    return {"population": len(members), "rows_per_call": per_call, "plain": plain, "es": es,
            "es_over_plain": es["samples_per_s"] / plain["samples_per_s"],
            "parameters": sum(t.numel() for t in edges.weights.master.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder with data/")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16")
    args = p.parse_args(argv)
    report = {}
    for name, setting in SETTINGS.items():
        try:
            report[name] = setting_throughput(args.model, args.device, args.dtype, setting)
        except BadInput as exc:
            print(f"gpu_throughput.py: error: {exc}", file=sys.stderr)
            return 2
        gc.collect()  # the setting's model and master copy go before the next is loaded
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
