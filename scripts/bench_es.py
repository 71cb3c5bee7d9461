"""ES engine benchmarks, side by side in one run on a testbed model.

    python scripts/bench_es.py --size default --backend vllm --population 8 --prompts 64

Measures (record the output in docs/benchmarks.md with the machine):
1. perturb + restore time as a share of one member's evaluation time;
2. keyed-noise generation throughput against a plain copy of the same number of bytes;
3. bytes one rank sends over MPI per iteration (its pickled rewards) against the model size;
4. iteration time of `mpirun -n 2` against one process at the same population;
5. ES population throughput (samples/s) against plain generation of the same prompts and
   sample count on the same backend, without ES.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from es_llm.backends.base import SamplingParams
from es_llm.comm.serial import SerialComm
from es_llm.es.config import ESRunConfig, ESSettings
from es_llm.es.engine import es_config, evaluate_members, prompt_batch
from es_llm.es.setup import build_edges, resolve_training_data
from es_llm.tasks import TaskConfig
from es_llm.testbed.build import build_testbed
from es_llm.testbed.config import load_testbed_config
from populations import es as pes


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def in_process(cfg: ESRunConfig, repeats: int) -> dict:
    edges, problems = build_edges(cfg, SerialComm())
    es_cfg = es_config(cfg)
    state = pes.init(es_cfg, edges.weights.master)
    member = pes.ask(es_cfg, state)[1]
    eps_for = pes.noise_for(es_cfg, state)
    noise = lambda name, shape: member.sign * eps_for(member.direction, name, shape)  # noqa: E731
    batch = prompt_batch(problems, cfg, 0)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)
    prompts = [p.prompt for p in batch]

    t_perturb_restore = timed(lambda: (edges.weights.perturb(noise, cfg.es.sigma),
                                       edges.weights.restore()), repeats)
    t_generate = timed(lambda: edges.backend.generate(prompts, params), repeats)
    t_noise = timed(lambda: [eps_for(1, n, s) for n, s in edges.weights.shapes().items()], repeats)
    numel = sum(s.numel() for s in edges.weights.shapes().values())
    src = torch.randn(numel)
    t_copy = timed(lambda: src.clone(), repeats)

    t_plain = timed(lambda: [edges.backend.generate(prompts, params)
                             for _ in range(cfg.es.population)], 1)
    t_es = timed(lambda: evaluate_members(edges, es_cfg, state, pes.ask(es_cfg, state), batch,
                                          cfg), 1)
    rewards = evaluate_members(edges, es_cfg, state, pes.ask(es_cfg, state), batch, cfg)
    half = {n: r for n, r in rewards.items() if n % 2 == 0}  # rank 0's share with 2 ranks
    edges.task.close()
    samples = cfg.es.population * len(prompts)
    return {
        "parameters": numel,
        "perturb_restore_s": t_perturb_restore, "member_generate_s": t_generate,
        "perturb_restore_share": t_perturb_restore / (t_generate + t_perturb_restore),
        "noise_MBps": numel * 4 / t_noise / 1e6, "copy_MBps": numel * 4 / t_copy / 1e6,
        "mpi_bytes_per_rank": len(pickle.dumps(half)), "model_bytes": numel * 4,
        "es_samples_per_s": samples / t_es, "plain_samples_per_s": samples / t_plain,
    }


def iteration_times(model: str, cfg_args: list[str], ranks: int) -> float:
    out = Path(tempfile.mkdtemp(prefix="bench-es-"))
    cmd = [sys.executable, "-m", "es_llm", "es", "--out", str(out / "run"), "--no-progress",
           f"model={model}", *cfg_args]
    if ranks > 1:
        mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
        cmd = [mpirun, "-n", str(ranks), *cmd]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    return statistics.median(r["perf/iter_s"] for r in rows[1:])  # the first one warms up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["ci", "default"], default="default", help="testbed preset")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="vllm", help="generation backend")
    ap.add_argument("--population", type=int, default=8, help="members per iteration")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per member")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of the micro timings")
    args = ap.parse_args()

    path, _ = build_testbed(load_testbed_config(args.size), progress=False)
    es_args = [f"backend={args.backend}", f"iterations={args.iterations}",
               f"es.population={args.population}", f"prompts_per_iteration={args.prompts}",
               "es.sigma=0.01", "es.lr=0.005", "checkpoint_every=1000"]
    one = iteration_times(str(path), es_args, 1)  # one process uses both cores
    two = iteration_times(str(path), es_args, 2)  # one core per rank
    cfg = resolve_training_data(ESRunConfig(
        model=str(path), task=TaskConfig(name="countdown"), backend=args.backend,
        prompts_per_iteration=args.prompts,
        es=ESSettings(population=args.population, sigma=0.01, lr=0.005)))
    r = in_process(cfg, args.repeats)
    print(f"testbed {args.size} ({r['parameters']:,} evolving parameters), backend {args.backend}, "
          f"N={args.population}, {args.prompts} prompts, greedy")
    print(f"1. perturb+restore {r['perturb_restore_s'] * 1e3:.1f} ms vs member generation "
          f"{r['member_generate_s'] * 1e3:.0f} ms: {100 * r['perturb_restore_share']:.2f}% of a "
          f"member's evaluation")
    print(f"2. keyed noise {r['noise_MBps']:.0f} MB/s vs copy {r['copy_MBps']:.0f} MB/s: "
          f"{100 * r['noise_MBps'] / r['copy_MBps']:.1f}% of copy bandwidth")
    print(f"3. MPI bytes per rank per iteration {r['mpi_bytes_per_rank']:,} vs model "
          f"{r['model_bytes']:,} bytes (fp32): ratio {r['mpi_bytes_per_rank'] / r['model_bytes']:.2e}"
          f" (grows with N x prompts, not with model size)")
    print(f"4. iteration time: 1 process {one:.2f} s, mpirun -n 2 {two:.2f} s: "
          f"{one / two:.2f}x faster with 2 ranks")
    print(f"5. ES {r['es_samples_per_s']:.0f} samples/s vs plain generation "
          f"{r['plain_samples_per_s']:.0f} samples/s: {r['es_samples_per_s'] / r['plain_samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
