"""Generation throughput of full against sliding-window attention, side by side in one run.

    python scripts/bench_swa.py --testbed DIR --prompts 200 --n 16

DIR is a testbed build with its sliding-window conversion (`es-llm testbed ...
swa.enabled=true`): the student (full attention) and DIR/swa (the same shape, its layers
attending over the window). Both sample the same held-out prompts with the same settings.
transformers: one process, the two models alternated --repeats times. vLLM: its engines
share process-wide state, so each timed call runs in a process of its own (the engine's
start-up is not timed), alternating full, sliding, full, ... Prints samples/s and tokens/s
(medians) and the sliding / full ratios. Record the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from es_llm.backends.base import SamplingParams
from es_llm.io import read_jsonl


def _prompts(model: Path, count: int) -> list[str]:
    return [r["prompt"] for r in read_jsonl(model / "data" / "countdown_eval.jsonl")][:count]


def _timed(backend, prompts: list[str], params: SamplingParams) -> tuple[float, int]:
    """Seconds of one call and the tokens it generated."""
    t0 = time.perf_counter()
    out = backend.generate(prompts, params)
    return time.perf_counter() - t0, sum(len(c.token_ids) for row in out for c in row)


def _one_vllm_call(model: str, prompts: int, n: int, max_tokens: int) -> None:
    """The --vllm-once mode: one engine, a warm-up, one timed call; prints JSON."""
    from es_llm.backends import BackendSpec, make_backend

    params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=0)
    engine = make_backend(BackendSpec(model, backend="vllm"))
    texts = _prompts(Path(model), prompts)
    engine.generate(texts[:8], params)
    seconds, tokens = _timed(engine, texts, params)
    print(json.dumps({"seconds": seconds, "tokens": tokens}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testbed", required=True, help="testbed folder with swa/ inside")
    ap.add_argument("--prompts", type=int, default=200, help="held-out prompts per call")
    ap.add_argument("--n", type=int, default=16, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=64, help="longest completion")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per model and backend")
    ap.add_argument("--backends", default="hf,vllm", help="hf, vllm or both")
    ap.add_argument("--vllm-once", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_once:
        return _one_vllm_call(args.vllm_once, args.prompts, args.n, args.max_tokens)

    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # one weight-loading bar per model is noise here
    root = Path(args.testbed)
    if not (root / "swa" / "config.json").is_file():
        sys.exit(f"{root} has no swa/ folder; build it with `es-llm testbed ... swa.enabled=true`.")
    models = {"full": root, "sliding": root / "swa"}
    window = json.loads((root / "swa" / "config.json").read_text())["sliding_window"]
    prompts = _prompts(root, args.prompts)
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens, seed=0)
    print(f"{len(prompts)} prompts x n={args.n}, max_tokens={args.max_tokens}, T=1.0, window "
          f"{window}, {args.repeats} alternating repeats")
    backends = args.backends.split(",")
    results: dict[tuple[str, str], list[tuple[float, int]]] = {}
    if "hf" in backends:
        from es_llm.backends import BackendSpec, make_backend
        engines = {name: make_backend(BackendSpec(str(path), backend="hf"))
                   for name, path in models.items()}
        for engine in engines.values():
            engine.generate(prompts[:8], params)
        for _ in range(args.repeats):
            for name, engine in engines.items():
                results.setdefault(("hf", name), []).append(_timed(engine, prompts, params))
    if "vllm" in backends:
        for _ in range(args.repeats):
            for name, path in models.items():
                proc = subprocess.run(
                    [sys.executable, __file__, "--testbed", str(root), "--vllm-once", str(path),
                     "--prompts", str(args.prompts), "--n", str(args.n), "--max-tokens",
                     str(args.max_tokens)], capture_output=True, text=True, check=True)
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                results.setdefault(("vllm", name), []).append((row["seconds"], row["tokens"]))
    samples = len(prompts) * args.n
    for backend in backends:
        rates = {}
        for name in models:
            runs = results[(backend, name)]
            rates[name] = (statistics.median(samples / s for s, _ in runs),
                           statistics.median(t / s for s, t in runs))
            print(f"{backend:5s} {name:8s} samples/s {rates[name][0]:8.1f}  tokens/s "
                  f"{rates[name][1]:9.0f}  (calls: "
                  f"{', '.join(f'{s:.1f} s' for s, _ in runs)})")
        print(f"{backend:5s} sliding / full: samples/s {rates['sliding'][0] / rates['full'][0]:.2f}"
              f", tokens/s {rates['sliding'][1] / rates['full'][1]:.2f}")


if __name__ == "__main__":
    main()
