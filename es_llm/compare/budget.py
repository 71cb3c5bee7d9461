"""Accuracy against training budget: the checkpoints along each training run, every one read
on the same problems, placed by generated samples and by training seconds.

A run folder of `es-llm es` or `es-llm grpo` holds ``metrics.jsonl`` (one row per iteration
or step, with ``samples/generated`` and the step's seconds, ``perf/iter_s`` for ES and
``perf/step_s`` for GRPO) and ``checkpoints/step_K`` (after K steps) and ``checkpoints/final``.
Seconds are the training loop's own (generation, scoring and update), summed over the steps
before the checkpoint, so runs on the same machine compare; the EGGROLL authors call a budget
in completions alone a poor measure, hence both axes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from es_llm.compare.analysis import paired, passk_table, resample_weights
from es_llm.errors import BadInput
from es_llm.io import complete_jsonl_rows

STEP_SECONDS = ("perf/iter_s", "perf/step_s")


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
    weights = resample_weights(len(ids), rng, resamples)
    out = {"greedy": paired(g_P, b_P, weights)}
    if sampled is not None and base_sampled is not None:
        sids = sorted(base_sampled)
        s_PK = passk_table(_matrix(sampled, sids, "a sampled read"), ks)
        b_PK = passk_table(_matrix(base_sampled, sids, "the base model's sampled read"), ks)
        sw = resample_weights(len(sids), rng, resamples)
        out["passk"] = {str(k): paired(s_PK[:, j], b_PK[:, j], sw) for j, k in enumerate(ks)}
    return out


def summarise(points: dict[str, list[list[dict]]]) -> list[dict]:
    """Rows of the budget table: per method and checkpoint position, the seed mean of every
    statistic (``points[method][seed]`` is that seed's checkpoints, each with ``stats``)."""
    rows = []
    for method, seeds in points.items():
        for i in range(min(len(s) for s in seeds)):
            at = [s[i] for s in seeds]
            row = {"method": method, "seeds": len(at), "steps": at[0]["steps"],
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


def table_markdown(rows: list[dict], base: dict) -> str:
    """The budget table: one line per method and checkpoint."""
    ks = list(rows[0].get("passk", {})) if rows else []
    head = ("| method | seeds | samples | seconds | greedy | greedy gain per seed [95% CI] |"
            + "".join(f" pass@{k} |" for k in ks))
    lines = [head, "|" + "---|" * (6 + len(ks))]
    lines.append(f"| base | - | 0 | 0 | {100 * base['greedy']:.1f}% | - |"
                 + "".join(f" {100 * base['passk'][k]:.1f}% |" for k in ks))
    for r in rows:
        gains = "; ".join(f"{100 * g:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                          for g, (lo, hi) in zip(r["greedy_gain"], r["greedy_ci95"]))
        lines.append(f"| {r['method']} | {r['seeds']} | {r['samples']:,.0f} | {r['seconds']:,.0f} "
                     f"| {100 * r['greedy']:.1f}% | {gains} |"
                     + "".join(f" {100 * r['passk'][k]:.1f}% |" for k in ks))
    return "\n".join(lines) + "\n"


def figure(rows: list[dict], base: dict, path: Path) -> str:
    """Greedy accuracy and sampled pass@k against samples (left) and seconds (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(rows[0].get("passk", {})) if rows else []
    panels = [("greedy", "greedy accuracy (never-seen)")] + [(k, f"pass@{k}") for k in ks]
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.4 * len(panels)), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for (stat, label), pair in zip(panels, axes):
        for ax, axis in zip(pair, ("samples", "seconds")):
            base_y = base["greedy"] if stat == "greedy" else base["passk"][stat]
            ax.axhline(base_y, color="black", lw=0.8, ls=":", label="base")
            for m in methods:
                mine = [r for r in rows if r["method"] == m]
                ys = [r["greedy"] if stat == "greedy" else r["passk"][stat] for r in mine]
                # Every curve starts at the base model (no training yet).
                ax.plot([0.0] + [r[axis] for r in mine], [base_y] + ys, marker="o", label=m)
            ax.set_xlabel("generated training samples" if axis == "samples"
                          else "training seconds (same machine)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_json(path: Path, data: dict) -> None:
    from es_llm.io import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=1) + "\n")
