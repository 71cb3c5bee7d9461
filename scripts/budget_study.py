"""Accuracy against training budget, from the checkpoints saved along training runs.

    python scripts/budget_study.py --out runs/budget --base runs/main/testbed \
        --data runs/main/never_seen.jsonl \
        --runs es=runs/main/runs/es-seed0,runs/main/runs/es-seed1 grpo=runs/main/runs/grpo-seed0

Every checkpoint of every run (``checkpoints/step_K`` and ``final``) and the base model are
read greedily on all of ``--data`` and, with ``--n`` > 0, sampled ``--n`` times at
``--temperature`` on every ``--stride``-th problem of it; each read is one `es-llm eval`
command (printed; a finished read is reused when the study is run again). Writes
OUT/budget.json (every number), OUT/report.md (the table) and OUT/budget.png (accuracy
against generated training samples and against training seconds). A label's runs are its
training seeds: the table shows their mean and each seed's paired gain over the base model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from es_llm.compare import budget
from es_llm.errors import BadInput
from es_llm.io import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]


def parse_runs(items: list[str]) -> dict[str, list[Path]]:
    runs = {}
    for item in items:
        label, sep, dirs = item.partition("=")
        if not sep or not label or not dirs:
            raise BadInput(f"--runs {item!r} must look like LABEL=RUN_DIR[,RUN_DIR...] "
                           f"(e.g. es=runs/main/runs/es-seed0).")
        runs[label] = [Path(d) for d in dirs.split(",")]
    return runs


def read(model: str, data: Path, out: Path, n: int, temperature: float, backend: str) -> Path:
    """`es-llm eval` of ``model`` into ``out`` unless a finished read is there."""
    if not (out / "metrics.json").is_file():
        cmd = [sys.executable, "-m", "es_llm", "eval", "--model", model, "--task", "countdown",
               "--data", str(data), "--n", str(n), "--temperature", str(temperature),
               "--backend", backend, "--out", str(out), "--no-progress"]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out / "samples.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True, metavar="LABEL=DIR[,DIR...]",
                    help="training run folders per method (several = training seeds)")
    ap.add_argument("--base", required=True, help="the base model the runs started from")
    ap.add_argument("--data", required=True, help="problems every checkpoint is read on")
    ap.add_argument("--out", required=True, help="study folder")
    ap.add_argument("--n", type=int, default=8, help="sampled reads per problem (0 = greedy only)")
    ap.add_argument("--temperature", type=float, default=0.6, help="temperature of sampled reads")
    ap.add_argument("--stride", type=int, default=4,
                    help="sampled reads use every STRIDE-th problem of --data")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 8], help="pass@k reported")
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm", "auto"],
                    help="generation backend of the reads")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args()
    try:
        return study(args)
    except BadInput as exc:
        print(f"budget_study: error: {exc}", file=sys.stderr)
        return 2


def study(args) -> int:
    runs = parse_runs(args.runs)
    data, out = Path(args.data), Path(args.out)
    if not data.is_file():
        raise BadInput(f"--data {args.data!r} is not a file of problems.")
    if args.n and any(k > args.n for k in args.k):
        raise BadInput(f"--k {args.k} asks for pass@k above --n {args.n} samples per problem.")
    points = {label: [budget.budget_points(r) for r in dirs] for label, dirs in runs.items()}
    out.mkdir(parents=True, exist_ok=True)
    sampled_data = out / "sampled_problems.jsonl"
    if args.n:
        lines = data.read_text().splitlines()
        write_text_atomic(sampled_data, "\n".join(lines[::args.stride]) + "\n")

    def reads(model: str, name: str):
        greedy = budget.read_correct(read(model, data, out / "reads" / name / "greedy", 1, 0.0,
                                          args.backend))
        sampled = None
        if args.n:
            sampled = budget.read_correct(read(model, sampled_data, out / "reads" / name /
                                               "sampled", args.n, args.temperature, args.backend))
        return greedy, sampled

    rng = np.random.default_rng(args.seed)
    base_g, base_s = reads(args.base, "base")
    for label, seeds in points.items():
        for s, seed_points in enumerate(seeds):
            for p in seed_points:
                g, smp = reads(p["checkpoint"], f"{label}-{s}-{p['steps']}")
                p["stats"] = budget.point_stats(g, base_g, smp, base_s, args.k, rng)
    ks = [str(k) for k in args.k] if args.n else []
    base = {"greedy": float(np.mean([v[0] for v in base_g.values()])),
            "passk": {k: float(np.mean([budget.passk_table(np.array([v]), [int(k)])[0, 0]
                                        for v in base_s.values()])) for k in ks}}
    rows = budget.summarise(points)
    budget.write_json(out / "budget.json", {"base": base, "rows": rows, "points": points,
                                            "settings": vars(args)})
    figure = budget.figure(rows, base, out / "budget.png")
    report = ("# Accuracy against training budget\n\n"
              f"Greedy reads on {len(base_g):,} problems of {data.name}"
              + (f"; sampled reads: {args.n} per problem at T = {args.temperature} on "
                 f"{len(base_s):,} of them" if args.n else "")
              + ". Seconds are the training loop's own, summed to each checkpoint.\n\n"
              + budget.table_markdown(rows, base) + f"\n![budget]({figure})\n")
    write_text_atomic(out / "report.md", report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
