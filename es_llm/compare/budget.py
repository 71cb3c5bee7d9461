"""Accuracy against training budget (``es-llm compare --budget-runs``): the checkpoints along
each training run, every one read on the same problems, placed by generated samples and by
training seconds.

A run folder of `es-llm es` or `es-llm grpo` holds ``metrics.jsonl`` (one row per iteration
or step, with ``samples/generated`` and the step's seconds, ``perf/iter_s`` for ES and
``perf/step_s`` for GRPO) and ``checkpoints/step_K`` (after K steps) and ``checkpoints/final``.
Seconds are the training loop's own (generation, scoring and update), summed over the steps
before the checkpoint, so runs on the same machine compare; the EGGROLL authors call a budget
in completions alone a poor measure, hence both axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from es_llm.compare.analysis import paired, passk_table, shared_resamples
from es_llm.errors import BadInput
from es_llm.io import complete_jsonl_rows, write_text_atomic

STEP_SECONDS = ("perf/iter_s", "perf/step_s")


@dataclass(frozen=True)
class BudgetConfig:
    # Training runs read checkpoint by checkpoint, as METHOD@SEED=RUN_DIR (or METHOD=RUN_DIR):
    # every checkpoints/step_K and final of an `es-llm es` or `es-llm grpo` run folder.
    runs: tuple[str, ...] = ()
    # Problems every checkpoint and the reference model are read on; null = the first
    # also_on file, else the reference model's held-out file.
    data: str | None = None
    # Sampled reads per problem (0 = greedy only), at this temperature, on every stride-th
    # problem of the data; pass@k reported for each k (at most n).
    n: int = 4
    temperature: float = 0.6
    stride: int = 4
    k: tuple[int, ...] = (1, 4)
    # Generation backend of these reads (null = the comparison's): dozens of short reads are
    # quicker on hf where vLLM's start-up per read dominates.
    backend: str | None = None

    def __post_init__(self):
        if self.backend not in (None, "auto", "hf", "vllm"):
            raise BadInput(f"budget.backend must be null (the comparison's), auto, hf or vllm; "
                           f"got {self.backend!r}.")
        if self.n < 0 or self.stride < 1 or not self.temperature > 0:
            raise BadInput(f"budget.n must be >= 0, budget.stride >= 1 and budget.temperature "
                           f"> 0; got n={self.n}, stride={self.stride}, "
                           f"temperature={self.temperature}.")
        if self.n and (not self.k or any(k < 1 or k > self.n for k in self.k)):
            raise BadInput(f"budget.k {list(self.k)} must be between 1 and budget.n={self.n} "
                           f"samples per problem.")


def parse_runs(entries: tuple[str, ...]) -> dict[str, list[tuple[str, list[dict]]]]:
    """``{method: [(label, budget_points(run))]}`` from METHOD[@SEED]=RUN_DIR entries, every
    run checked (BadInput naming the entry otherwise)."""
    out: dict[str, list[tuple[str, list[dict]]]] = {}
    seen = set()
    for entry in entries:
        label, sep, folder = entry.partition("=")
        if not sep or not label or not folder:
            raise BadInput(f"--budget-runs entry {entry!r} is not METHOD@SEED=RUN_DIR (e.g. "
                           f"es@0=runs/main/runs/es-seed0).")
        if label in seen:
            raise BadInput(f"--budget-runs label {label!r} is given more than once.")
        seen.add(label)
        out.setdefault(label.split("@")[0], []).append((label, budget_points(Path(folder))))
    return out


def budget_points(run: Path) -> list[dict]:
    """``[{"checkpoint", "steps", "samples", "seconds"}]`` for every checkpoint of ``run``,
    in training order. BadInput when the folder is not a finished training run."""
    rows = complete_jsonl_rows(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    folder = run / "checkpoints"
    if not rows or not (folder / "final").is_dir():
        raise BadInput(f"{run} is not a finished training run: it needs metrics.jsonl and "
                       f"checkpoints/final (what `es-llm es` and `es-llm grpo` write).")
    key = next((k for k in STEP_SECONDS if k in rows[0]), None)
    if key is None or "samples/generated" not in rows[0]:
        raise BadInput(f"{run / 'metrics.jsonl'} has no samples/generated or step time "
                       f"({' or '.join(STEP_SECONDS)}); it is not an es-llm training log.")
    seconds = np.cumsum([r[key] for r in rows])
    steps = {int(p.name[5:]): p for p in folder.glob("step_*") if p.name[5:].isdigit()}
    steps[len(rows)] = folder / "final"
    return [{"checkpoint": str(path), "steps": k, "samples": float(rows[k - 1]["samples/generated"]),
             "seconds": float(seconds[k - 1])} for k, path in sorted(steps.items()) if k <= len(rows)]


def read_correct(samples: Path) -> dict[str, list[bool]]:
    """Problem id -> the correctness of its samples, from an `es-llm eval` samples.jsonl."""
    out: dict[str, list[bool]] = {}
    for row in complete_jsonl_rows(samples):
        out.setdefault(row["problem_id"], []).append(bool(row["correct"]))
    if not out:
        raise BadInput(f"{samples} holds no samples.")
    return out


def _matrix(correct: dict[str, list[bool]], ids: list[str], what: str) -> np.ndarray:
    missing = [i for i in ids if i not in correct]
    if missing:
        raise BadInput(f"{what} has no samples for {len(missing)} of the problems (e.g. "
                       f"{missing[0]}); every checkpoint must be read on the same problems.")
    return np.array([correct[i] for i in ids], dtype=bool)


def point_stats(greedy: dict, base_greedy: dict, sampled: dict | None, base_sampled: dict | None,
                ks: list[int], rng: np.random.Generator, resamples: int = 2000) -> dict:
    """Greedy accuracy and its paired gain over the base model (95% bootstrap over problems),
    and, when sampled reads are given, pass@k for ``ks`` and its gain over the base."""
    ids = sorted(base_greedy)
    g_P = _matrix(greedy, ids, "a greedy read")[:, 0].astype(float)
    b_P = _matrix(base_greedy, ids, "the base model's greedy read")[:, 0].astype(float)
    greedy_draws = shared_resamples(len(ids), rng, resamples)
    out = {"greedy": paired(g_P, b_P, greedy_draws)}
    if sampled is not None and base_sampled is not None:
        sids = sorted(base_sampled)
        s_PK = passk_table(_matrix(sampled, sids, "a sampled read"), ks)
        b_PK = passk_table(_matrix(base_sampled, sids, "the base model's sampled read"), ks)
        sampled_draws = shared_resamples(len(sids), rng, resamples)
        out["passk"] = {str(k): paired(s_PK[:, j], b_PK[:, j], sampled_draws)
                        for j, k in enumerate(ks)}
    return out


def summarise(points: dict[str, list[list[dict]]]) -> list[dict]:
    """Rows of the budget table: per method and checkpoint step, the mean of every statistic
    over the seeds that have that checkpoint (``points[method][seed]`` is that seed's
    checkpoints, each with ``stats``; a run continued past the others adds rows of its own)."""
    rows = []
    for method, seeds in points.items():
        for steps in sorted({p["steps"] for s in seeds for p in s}):
            at = [p for s in seeds for p in s if p["steps"] == steps]
            row = {"method": method, "seeds": len(at), "steps": steps,
                   "samples": float(np.mean([p["samples"] for p in at])),
                   "seconds": float(np.mean([p["seconds"] for p in at])),
                   "greedy": float(np.mean([p["stats"]["greedy"]["a"] for p in at])),
                   "greedy_gain": [p["stats"]["greedy"]["diff"] for p in at],
                   "greedy_ci95": [p["stats"]["greedy"]["ci95"] for p in at]}
            if "passk" in at[0]["stats"]:
                row["passk"] = {k: float(np.mean([p["stats"]["passk"][k]["a"] for p in at]))
                                for k in at[0]["stats"]["passk"]}
            rows.append(row)
    return rows


def table(rows: list[dict], base: dict, reference: str) -> tuple[list[str], list[list[str]]]:
    """The budget table (header, rows): the reference model, then one line per method and
    checkpoint, each seed's paired greedy gain with its 95% interval."""
    ks = list(base["passk"])
    header = (["method", "seeds", "samples", "seconds", "greedy",
               f"greedy - {reference} per seed [95% CI]"] + [f"pass@{k}" for k in ks])
    out = [[reference, "-", "0", "0", f"{100 * base['greedy']:.1f}%", "-"]
           + [f"{100 * base['passk'][k]:.1f}%" for k in ks]]
    for r in rows:
        gains = "; ".join(f"{100 * g:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                          for g, (lo, hi) in zip(r["greedy_gain"], r["greedy_ci95"]))
        out.append([r["method"], str(r["seeds"]), f"{r['samples']:,.0f}", f"{r['seconds']:,.0f}",
                    f"{100 * r['greedy']:.1f}%", gains]
                   + [f"{100 * r['passk'][k]:.1f}%" for k in ks])
    return header, out


Read = Callable[[str, Path, int, float, Path], Path]


def study(cfg: BudgetConfig, reference: Path, data: Path, folder: Path, read: Read,
          rng: np.random.Generator, resamples: int) -> dict:
    """Read the reference model and every checkpoint of ``cfg.runs`` on ``data`` (greedily, and
    sampled on every stride-th problem), then the statistics of each checkpoint against the
    reference. ``read(model, problems, n, temperature, folder)`` samples one model into
    ``folder`` (reusing an identical earlier read) and returns its samples file."""
    runs = parse_runs(cfg.runs)
    folder.mkdir(parents=True, exist_ok=True)
    sampled_data = folder / "sampled_problems.jsonl"
    if cfg.n:
        lines = [line for line in data.read_text().splitlines() if line.strip()]
        write_text_atomic(sampled_data, "\n".join(lines[::cfg.stride]) + "\n")

    def reads(model: str, name: str) -> tuple[dict, dict | None]:
        greedy = read_correct(read(model, data, 1, 0.0, folder / name / "greedy"))
        sampled = (read_correct(read(model, sampled_data, cfg.n, cfg.temperature,
                                     folder / name / "sampled")) if cfg.n else None)
        return greedy, sampled

    base_g, base_s = reads(str(reference), "reference")
    ks = list(cfg.k) if cfg.n else []
    points: dict[str, list[list[dict]]] = {}
    for method, seeds in runs.items():
        for label, seed_points in seeds:
            for p in seed_points:
                g, smp = reads(p["checkpoint"], f"{label}/step_{p['steps']}")
                p["stats"] = point_stats(g, base_g, smp, base_s, ks, rng, resamples)
            points.setdefault(method, []).append(seed_points)
    base = {"greedy": float(np.mean([v[0] for v in base_g.values()])),
            "passk": {str(k): float(np.mean(passk_table(_matrix(base_s, sorted(base_s), "the "
                                                                "reference's sampled read"),
                                                        [k])[:, 0])) for k in ks}}
    return {"data": str(data), "num_problems": len(base_g),
            "num_sampled": len(base_s) if base_s else 0, "n": cfg.n,
            "temperature": cfg.temperature, "k": ks, "base": base,
            "runs": {label: method for method, seeds in runs.items() for label, _ in seeds},
            "rows": summarise(points), "points": points}
