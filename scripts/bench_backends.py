"""Sampling throughput of the two generation backends, side by side in one run.

    python scripts/bench_backends.py --size ci --prompts 300 --n 16 --repeats 3

Builds (or reuses) the testbed, then alternates HF and vLLM on the same held-out prompts
and sampling settings, and prints samples/s for each and their ratio. Engine start-up is
timed separately. Record the figures in docs/benchmarks.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import statistics
import time

from es_llm.backends.base import SamplingParams
from es_llm.io import read_jsonl
from es_llm.testbed.build import model_or_testbed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["ci", "default"], default="ci", help="testbed preset")
    ap.add_argument("--prompts", type=int, default=300, help="held-out prompts per call")
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=64, help="longest completion")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per backend")
    ap.add_argument("--model", help="benchmark this testbed model folder (with its "
                                    "data/countdown_eval.jsonl) instead of building --size")
    args = ap.parse_args()

    path, what = model_or_testbed(args.model, args.size)
    prompts = [r["prompt"] for r in read_jsonl(path / "data" / "countdown_eval.jsonl")][:args.prompts]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=0)

    from es_llm.backends import BackendSpec, make_backend
    t0 = time.perf_counter()
    hf = make_backend(BackendSpec(str(path), backend="hf"))
    hf_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    vl = make_backend(BackendSpec(str(path), backend="vllm"))
    vl_start = time.perf_counter() - t0
    vl.generate(prompts[:8], params)  # warm-up: first-call kernel set-up is not throughput

    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    tokens: dict[str, list[int]] = {"hf": [], "vllm": []}
    for _ in range(args.repeats):
        for name, backend in (("hf", hf), ("vllm", vl)):
            t0 = time.perf_counter()
            out = backend.generate(prompts, params)
            dt = time.perf_counter() - t0
            rates[name].append(len(prompts) * args.n / dt)
            tokens[name].append(sum(len(c.token_ids) for row in out for c in row))
    print(f"{what}: {len(prompts)} prompts x n={args.n}, max_tokens={args.max_tokens}, "
          f"T=1.0, {args.repeats} alternating repeats")
    print(f"start-up: hf {hf_start:.1f} s, vllm {vl_start:.1f} s")
    for name in ("hf", "vllm"):
        print(f"{name:5s} samples/s median {statistics.median(rates[name]):8.0f}  "
              f"(all: {', '.join(f'{r:.0f}' for r in rates[name])}; "
              f"mean tokens/sample {statistics.mean(tokens[name]) / (len(prompts) * args.n):.1f})")
    print(f"ratio vllm/hf: {statistics.median(rates['vllm']) / statistics.median(rates['hf']):.2f}")


if __name__ == "__main__":
    main()
