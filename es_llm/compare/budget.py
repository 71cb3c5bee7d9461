"""Accuracy against training budget (``es-llm compare --budget-runs``): the checkpoints along
each training run, every one read on the same problems, placed by generated samples and by
training seconds.

A run folder of `es-llm es` or `es-llm grpo` holds ``metrics.jsonl`` (one row per iteration
or step, with ``samples/generated`` and the step's seconds, ``perf/iter_s`` for ES and
``perf/step_s`` for GRPO) and ``checkpoints/step_K`` (after K steps) and ``checkpoints/final``.
Seconds are the training loop's own (generation, scoring and update), summed over the steps
before the checkpoint, so runs on the same machine compare; the EGGROLL authors call a budget
in completions alone a poor measure, hence both axes.

The comparison section ``budget_study`` (enabled by ``budget.runs``) is at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from es_llm.compare.analysis import paired, passk_table, shared_resamples
from es_llm.compare.config import BudgetConfig, CompareConfig
from es_llm.compare.sampling import sample_model
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, Source,
                                    fields_dict)
from es_llm.errors import BadInput
from es_llm.evaluate import EvalConfig
from es_llm.io import complete_jsonl_rows, write_text_atomic
from es_llm.models import resolve_task_config
from es_llm.report import (Figure, Heading, Paragraph, Table, colors, interval, pct, pyplot,
                           save_figure, signed)

STEP_SECONDS = ("perf/iter_s", "perf/step_s")


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
    gain = lambda x: signed(x, 1, 100)  # noqa: E731 (points, signed)
    header = (["method", "seeds", "samples", "seconds", "greedy",
               f"greedy - {reference} per seed [95% CI]"] + [f"pass@{k}" for k in ks])
    out = [[reference, "-", "0", "0", pct(base["greedy"]), "-"]
           + [pct(base["passk"][k]) for k in ks]]
    for r in rows:
        gains = "; ".join(interval(g, ci, gain) for g, ci in zip(r["greedy_gain"], r["greedy_ci95"]))
        out.append([r["method"], str(r["seeds"]), f"{r['samples']:,.0f}", f"{r['seconds']:,.0f}",
                    pct(r["greedy"]), gains] + [pct(r["passk"][k]) for k in ks])
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


# --- the section -------------------------------------------------------------------------------

def budget_data(cfg: CompareConfig, sources: tuple[Source, ...]) -> tuple[Path, Path]:
    """(reference model folder, problem file) of the budget study, or BadInput."""
    ref = [src.path for src in sources if src.name == cfg.reference]
    if not ref or not (ref[0] / "config.json").is_file():
        raise BadInput(f"--budget-runs reads the checkpoints against the reference model, so "
                       f"--reference must name one model folder among --models (got "
                       f"{cfg.reference!r}).")
    data = cfg.budget.data or (cfg.also_on[0] if cfg.also_on else None)
    if data is None:
        ev = resolve_task_config(EvalConfig(model=str(ref[0]), task=cfg.task))
        data = ev.task.data
    if data is None or not Path(data).is_file():
        raise BadInput(f"the budget study has no problem file to read the checkpoints on "
                       f"({data!r}); set budget.data=FILE, give --also-on FILE, or use a "
                       f"reference model with a held-out set (a testbed model).")
    return ref[0], Path(data)


def check(inp: CheckInput) -> tuple[Path, Path]:
    """The reference model and the problem file (``budget_data``), every run checked."""
    found = budget_data(inp.cfg, inp.sources)
    parse_runs(inp.cfg.budget.runs)
    return found


@dataclass(frozen=True)
class BudgetStudy:
    """comparison.json["budget_study"]: ``study``'s result and the reference's name."""

    reference: str
    data: str
    num_problems: int
    num_sampled: int
    n: int
    temperature: float
    k: list[int]
    base: dict
    runs: dict[str, str]
    rows: list[dict]
    points: dict

    def to_json(self) -> dict:
        return {"budget_study": fields_dict(self)}


def compute(inp: SectionInput) -> BudgetStudy:
    """The study's reads under OUT/samples/budget/, each sampled like every other model of the
    comparison (same seed, max_tokens, top_p and backend); ``inp.checked``: ``check``'s."""
    cfg, out = inp.cfg, inp.out
    reference, data = inp.checked
    inp.echo(f"[compare] accuracy along {len(cfg.budget.runs)} training runs")

    def read(model: str, problems: Path, n: int, temperature: float, folder: Path) -> Path:
        view = replace(cfg, task=replace(cfg.task, data=str(problems)),
                       sampling=replace(cfg.sampling, n=n, temperature=temperature),
                       backend=cfg.budget.backend or cfg.backend)
        return sample_model(str(folder.relative_to(out)), Path(model), view, folder,
                            inp.progress) / "samples.jsonl"

    result = study(cfg.budget, reference, data, out / "samples" / "budget", read, inp.rng(),
                   cfg.bootstrap)
    return BudgetStudy(reference=cfg.reference, **result)


def _value(p: dict, stat: str) -> float:
    return p["stats"]["greedy"]["a"] if stat == "greedy" else p["stats"]["passk"][stat]["a"]


def figure(result: dict, path: Path) -> str:
    """Greedy accuracy and sampled pass@k of the budget study (``study``) against generated
    samples (left) and training seconds (right): each seed thin, the seed mean bold where
    every seed of the method has that checkpoint (so a run continued alone does not bend the
    mean)."""
    plt = pyplot()
    base, points = result["base"], result["points"]
    panels = [("greedy", f"greedy accuracy ({Path(result['data']).stem})")] + [
        (str(k), f"pass@{k}, T = {result['temperature']:g}") for k in result["k"]]
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.4 * len(panels)), squeeze=False)
    color = colors(list(points))
    for (stat, label), pair in zip(panels, axes):
        base_y = base["greedy"] if stat == "greedy" else base["passk"][stat]
        for ax, axis in zip(pair, ("samples", "seconds")):
            ax.axhline(base_y, color="black", lw=0.8, ls=":", label="reference")
            for method, seeds in points.items():
                # Every curve starts at the reference model (no training yet).
                for seed in seeds:
                    ax.plot([0.0] + [p[axis] for p in seed], [base_y] + [_value(p, stat)
                            for p in seed], color=color[method], lw=0.8, alpha=0.35)
                # The summary rows are already seed means; keep those every seed has.
                mean = [r for r in result["rows"]
                        if r["method"] == method and r["seeds"] == len(seeds)]
                xs = [0.0] + [r[axis] for r in mean]
                ys = [base_y] + [r["greedy"] if stat == "greedy" else r["passk"][stat]
                                 for r in mean]
                ax.plot(xs, ys, color=color[method], lw=2, marker="o",
                        label=f"{method} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
            ax.set_xlabel("generated training samples" if axis == "samples"
                          else "training seconds (same machine)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, path)


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """Accuracy against training budget: every checkpoint along the runs, by generated samples
    and by the training loop's own seconds."""
    result = comp["budget_study"]
    reference = result["reference"]
    sampled = (f"; sampled {result['n']} times per problem at T = {result['temperature']:g} on "
               f"{result['num_sampled']:,} of them (every stride-th)" if result["n"] else "")
    return [Heading(2, "Accuracy against training budget"), Paragraph(
        f"Every checkpoint saved along {len(result['runs'])} training runs and the reference "
        f"model, read greedily on the {result['num_problems']:,} problems of "
        f"{Path(result['data']).name}{sampled}. Samples are the generated training samples and "
        f"seconds the training loop's own (generation, scoring and update), summed to each "
        f"checkpoint and averaged over the seeds that have it, so runs on the same machine "
        f"compare; a budget in completions alone hides what each sample costs."),
        Table(*table(result["rows"], result["base"], reference)),
        Figure(figures["budget_study"], "Accuracy against generated training samples (left) "
               "and training seconds (right): each training seed thin, the seed mean bold where "
               f"every seed of the method has that checkpoint; the dotted line is {reference}.")]


SECTIONS.register("budget_study")(Section(
    place=70, enabled=lambda cfg: bool(cfg.budget.runs), check=check, compute=compute,
    blocks=blocks,
    figures=lambda comp, folder: {"budget_study": figure(comp["budget_study"],
                                                         folder / "budget.png")}))
