"""HF decoding speed by KV cache (``runtime.kv_cache``: dynamic, static, compiled), side by side.

    python scripts/bench_decoding.py --model DEFAULT_TESTBED --random --batches 64 256 1024 \
        --tokens 64 256 --kv-caches dynamic static compiled

For each number of new tokens, batch size and KV cache: ``--calls`` greedy calls (default
2) of ``batch`` held-out prompts (the folder's data/countdown_eval.jsonl, repeated to fill
the batch) in one generate call. The first call includes the warm-up (and, for
``compiled``, compiling the decode step for that batch and length); the last is the figure.
Prints a markdown table: seconds of the first and last calls, generated tokens per second of
the last, and whether its greedy ids equal those of the first KV cache listed. ``--random``: the folder's model shape with random
weights (seed 0), so rows run to ``--tokens`` instead of stopping at a trained model's
end-of-sequence token (positions past the model's context are fine for rotary embeddings,
and only the timings mean anything). Record the figures in docs/benchmarks.md with the
machine.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch

from es_llm.backends.base import SamplingParams
from es_llm.backends.hf import HFBackend
from es_llm.errors import BadInput
from es_llm.io import read_jsonl
from es_llm.runtime import KV_CACHES


def load_model(path: str, random: bool):
    """The folder's model, or its shape with random weights (seed 0) when ``random``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not random:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))


def timed_calls(backend: HFBackend, prompts: list[str], params: SamplingParams, calls: int):
    """Seconds of each call (the first warms up) and the last call's token ids."""
    seconds = []
    for _ in range(calls):
        t0 = time.perf_counter()
        out = backend.generate(prompts, params)
        seconds.append(time.perf_counter() - t0)
    return seconds, [row[0].token_ids for row in out]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder with data/countdown_eval.jsonl")
    ap.add_argument("--random", action="store_true", help="the folder's shape, random weights")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--kv-caches", nargs="+", default=list(KV_CACHES),
                    help=f"any of: {', '.join(KV_CACHES)}")
    ap.add_argument("--calls", type=int, default=2, help="timed calls per setting (>= 1)")
    args = ap.parse_args(argv)
    if args.calls < 1:
        print(f"bench_decoding.py: error: --calls must be at least 1, got {args.calls}.",
              file=sys.stderr)
        return 2
    unknown = sorted(set(args.kv_caches) - set(KV_CACHES))
    if unknown:
        print(f"bench_decoding.py: error: unknown KV cache {', '.join(unknown)}; valid choices "
              f"are: {', '.join(KV_CACHES)}.", file=sys.stderr)
        return 2
    held_out = f"{args.model}/data/countdown_eval.jsonl"
    try:
        eval_rows = read_jsonl(held_out)
    except (OSError, BadInput) as exc:
        print(f"bench_decoding.py: error: the prompts are read from {held_out}, which does not "
              f"read ({exc}); --model must be a testbed or stand-in folder (es-llm testbed, "
              f"scripts/standin_model.py).", file=sys.stderr)
        return 2
    model = load_model(args.model, args.random)
    pool = [r["prompt"] for r in eval_rows]
    print(f"{args.model} ({'random weights' if args.random else 'trained'}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters), greedy, "
          f"{torch.get_num_threads()} threads")
    print(f"| new tokens | batch | kv_cache | first call s | last call s | tokens/s | "
          f"ids = {args.kv_caches[0]} |\n|---|---|---|---|---|---|---|")
    for tokens, batch in itertools.product(args.tokens, args.batches):
        prompts = list(itertools.islice(itertools.cycle(pool), batch))
        params = SamplingParams(n=1, temperature=0.0, max_tokens=tokens, seed=0)
        reference = None
        for kind in args.kv_caches:
            backend = HFBackend(args.model, batch_size=batch, model=model, kv_cache=kind)
            seconds, ids = timed_calls(backend, prompts, params, args.calls)
            reference = ids if reference is None else reference
            print(f"| {tokens} | {batch} | {kind} | {seconds[0]:.2f} | {seconds[-1]:.2f} | "
                  f"{sum(map(len, ids)) / seconds[-1]:,.0f} | "
                  f"{'yes' if ids == reference else 'NO'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
