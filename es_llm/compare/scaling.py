"""The pretraining-to-post-training study's analysis, figures and report
(``scripts/scaling_study.py`` collects the numbers; this turns them into ``scaling.json``,
``report.md``, ``report.html`` and ``figures/``).

The questions, after the source abstract (chess as a controlled testbed: post-RL performance
predicted by pretraining loss, the RL reward curve's slope growing about linearly with
pretraining tokens, RL amplifying moves the policy already preferred on easy puzzles and
surfacing nearly absent ones on hard puzzles), each asked of GRPO and of ES:

* **Accuracy against pretraining loss**: held-out pass@1 after post-training (seed means)
  against each build's held-out-stream loss, a least-squares line with t intervals and a
  confidence band (``es_llm.metrics.fits``).
* **Reward slope against pretraining tokens**: each run's least-squares slope of training
  reward against generated samples (per 1,000 samples), seed means per build, fitted
  against the build's pretraining tokens (millions). Every build's run of one seed draws the
  same prompt batches in the same order, so a batch's difficulty moves all builds' curves
  together and, over a few steps, enters every slope alike (scaled by how much the build
  solves); the report gives the mean correlation of per-step rewards between builds as the
  measure of that. Departure from the source: beside it, the **held-out gain** (pass@1 after
  minus before on the fixed held-out problems, per 1,000 generated samples), which no batch
  order touches, fitted against tokens the same way.
* **Change by base difficulty**: every (build, held-out problem) pair binned by the base
  model's log-probability of the problem's reference answer; per bin, the mean change of
  per-problem accuracy (c/n after minus before) and the share of the base's never-solved
  problems the method solves, with bootstrap intervals over pairs. Departure from the
  source: problems picked for having no hit in n samples come up in the next n by chance
  alone, so the never-solved pairs are picked by a second draw of the base (``redraw``,
  another sampling seed) and the method's share is set against the base's own on the same
  pairs and seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from es_llm.io import write_json_atomic
from es_llm.metrics.fits import curve_slope, line_band, linear_fit
from es_llm.metrics.passk import bootstrap_ci
from es_llm.report import (Figure, Heading, Paragraph, Table, bracket, fixed, pct, pyplot,
                           save_figure, signed, signed_points, write_report)

METHODS = ("grpo", "es")
# The base evaluated again on another sampling seed: the draw that picks "never solved".
NULL_ARM = "redraw"
# Bin edges of the base log10-probability of the reference answer: nearly absent, rare,
# plausible, already preferred.
LOG10_EDGES = (-4.0, -2.0, -0.5)
BIN_LABELS = ("p < 1e-4", "1e-4 <= p < 1e-2", "1e-2 <= p < 0.32", "p >= 0.32")


def _seed_mean(models: dict, method: str, key: str) -> float | None:
    vals = [m[key] for name, m in models.items() if name.split("@")[0] == method]
    return float(np.mean(vals)) if vals else None


def run_slope(curve: dict) -> float:
    """Reward gained per 1,000 generated samples along one run (least squares)."""
    return 1000.0 * curve_slope(curve["samples"], curve["reward"])


def _fit_or_none(x: list, y: list) -> dict | None:
    pts = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if len(pts) < 3 or len({a for a, _ in pts}) < 2:
        return None
    return linear_fit([a for a, _ in pts], [b for _, b in pts])


def build_rows(cells: list[dict]) -> list[dict]:
    """One row per build: its size, tokens, loss, and the seed-mean accuracies, reward
    slopes and held-out gains (pass@1 change per 1,000 generated samples)."""
    rows = []
    for c in cells:
        row = {k: c[k] for k in ("cell", "size", "parameters", "steps", "tokens",
                                 "heldout_loss")}
        row["base_pass@1"] = c["models"]["base"]["pass@1"]
        row["base_pass@k"] = c["models"]["base"]["pass@k"]
        for m in METHODS:
            row[f"{m}_pass@1"] = _seed_mean(c["models"], m, "pass@1")
            row[f"{m}_pass@k"] = _seed_mean(c["models"], m, "pass@k")
            curves = [v for k, v in c["curves"].items() if k.split("@")[0] == m]
            row[f"{m}_slope"] = float(np.mean([run_slope(v) for v in curves])) if curves else None
            row[f"{m}_gain"] = (1000.0 * (row[f"{m}_pass@1"] - row["base_pass@1"])
                                / float(np.mean([v["samples"][-1] for v in curves]))
                                if curves else None)
        rows.append(row)
    return rows


def shared_batch_correlation(cells: list[dict], method: str) -> dict | None:
    """How much the prompt batches move all builds' reward curves together: the Pearson
    correlation of per-step training rewards between every two builds' runs of one seed
    (the same batches in the same order), averaged over pairs and seeds. None without two
    builds of equal-length, non-constant curves."""
    by_seed: dict[str, list[np.ndarray]] = {}
    for c in cells:
        for name, curve in c["curves"].items():
            if name.split("@")[0] == method:
                by_seed.setdefault(name.split("@")[1], []).append(np.asarray(curve["reward"]))
    corr = [float(np.corrcoef(a, b)[0, 1])
            for curves in by_seed.values() for i, a in enumerate(curves) for b in curves[i + 1:]
            if a.size == b.size > 2 and a.std() > 0 and b.std() > 0]
    return {"mean": float(np.mean(corr)), "pairs": len(corr)} if corr else None


def _bin_row(acc: np.ndarray, hit: np.ndarray, base: np.ndarray, base_hit: np.ndarray | None,
             never: np.ndarray, sel: np.ndarray, rng: np.random.Generator,
             resamples: int) -> dict:
    """One bin (``sel``) of one method: the accuracy change over its pairs, and on its
    ``never``-solved pairs the share the method solves (``hit``: the share of its seeds with
    a correct sample, so three seeds get no more tries than one), the share the base's draw
    solves (``base_hit``; None: no share), and their paired difference, each with a
    bootstrap interval over pairs."""
    never = sel & never
    change = acc[sel] - base[sel]
    ci = (lambda x: list(bootstrap_ci(x, rng, resamples)) if x.size else None)
    mean = (lambda x: float(x.mean()) if x.size else None)
    beyond = hit[never] - base_hit[never] if base_hit is not None else np.empty(0)
    return {"pairs": int(sel.sum()), "base": float(base[sel].mean()),
            "after": float(acc[sel].mean()), "change": float(change.mean()),
            "change_ci": ci(change), "never_solved": int(never.sum()),
            "newly_solved": mean(hit[never]), "newly_solved_ci": ci(hit[never]),
            "base_solved": mean(base_hit[never]) if base_hit is not None else None,
            "beyond_base": mean(beyond), "beyond_base_ci": ci(beyond)}


def difficulty_change(cells: list[dict], rng: np.random.Generator, resamples: int) -> dict:
    """Per method and bin of the base's log-probability of the reference: the pairs, the
    base's and the method's mean accuracy and the mean change; and on the pairs the base
    never solved, the share the method solves against the share the base solves.

    Which pairs count as never solved is decided by the ``redraw`` (the base sampled again
    on another seed) when every cell has one: then neither the method's nor the base's
    evaluation picked the pairs, so chance alone (problems chosen for no hit in n samples
    come up in the next n) lifts both alike, and as both are sampled on the same seed, a
    method that did not move scores exactly the base. Without a redraw the pairs are the
    base's own zero-hit ones, and no base share is given (it would be 0 by construction).
    Intervals: bootstrap over pairs."""
    base_logp, base_acc, redraw_acc = [], [], []
    acc, hit = {m: [] for m in METHODS}, {m: [] for m in METHODS}
    for c in cells:
        n_b = c["models"]["base"]["n"]
        base_logp += c["reference_logp"]
        base_acc += [x / n_b for x in c["models"]["base"]["correct_P"]]
        redraw = c["models"].get(NULL_ARM)
        redraw_acc += ([x / redraw["n"] for x in redraw["correct_P"]] if redraw
                       else [math.nan] * len(c["reference_logp"]))
        for m in METHODS:
            seeds = [v for k, v in c["models"].items() if k.split("@")[0] == m]
            if not seeds:
                acc[m] += [math.nan] * len(c["reference_logp"])
                hit[m] += [math.nan] * len(c["reference_logp"])
                continue
            correct_S_P = np.asarray([s["correct_P"] for s in seeds], dtype=np.float64)
            n_S = np.asarray([[s["n"]] for s in seeds], dtype=np.float64)
            acc[m] += (correct_S_P / n_S).mean(axis=0).tolist()
            hit[m] += (correct_S_P > 0).mean(axis=0).tolist()
    bins = np.digitize(np.asarray(base_logp) / math.log(10), LOG10_EDGES)
    base, redraw = np.asarray(base_acc), np.asarray(redraw_acc)
    null = bool(np.isfinite(redraw).all())
    never = (redraw == 0) if null else (base == 0)
    base_hit = (base > 0).astype(float) if null else None
    out = {"labels": list(BIN_LABELS), "null": NULL_ARM if null else None,
           "pairs": [int((bins == b).sum()) for b in range(len(BIN_LABELS))]}
    for m in METHODS:
        a, h = np.asarray(acc[m]), np.asarray(hit[m])
        sel_B = [(bins == b) & np.isfinite(a) for b in range(len(BIN_LABELS))]
        out[m] = [_bin_row(a, h, base, base_hit, never, sel, rng, resamples) if sel.any()
                  else None for sel in sel_B]
    return out


def post_training_gain(cell: dict, method: str, rng: np.random.Generator,
                       resamples: int) -> dict:
    """The calibration's number: pass@1 of ``method`` (its seeds' mean per problem) minus the
    base's, in points, with a 95% bootstrap interval over the problems (paired: both on the
    same problems and sampling seed). ``cell`` is one collected build (``correct_P`` and
    ``n`` per model)."""
    models = cell["models"]
    runs = [m for name, m in models.items() if name.split("@")[0] == method]
    if not runs:
        raise ValueError(f"cell {cell['cell']} has no {method} run")
    trained_P = np.mean([np.asarray(m["correct_P"]) / m["n"] for m in runs], axis=0)
    base_P = np.asarray(models["base"]["correct_P"]) / models["base"]["n"]
    diff_P = 100.0 * (trained_P - base_P)
    lo, hi = bootstrap_ci(diff_P, rng, resamples)
    return {"cell": cell["cell"], "method": method, "seeds": len(runs),
            "problems": int(diff_P.size), "gain_points": float(diff_P.mean()),
            "ci95": [float(lo), float(hi)]}


def analyze(cells: list[dict], rng: np.random.Generator, resamples: int = 1000) -> dict:
    """Everything the report shows, JSON-ready, from the collected builds."""
    rows = build_rows(cells)
    loss = [r["heldout_loss"] for r in rows]
    tokens_m = [r["tokens"] / 1e6 for r in rows]
    fits = {m: _fit_or_none(loss, [r[f"{m}_pass@1"] for r in rows]) for m in ("base", *METHODS)}
    slopes = {m: _fit_or_none(tokens_m, [r[f"{m}_slope"] for r in rows]) for m in METHODS}
    gains = {m: _fit_or_none(tokens_m, [r[f"{m}_gain"] for r in rows]) for m in METHODS}
    return {"builds": rows, "accuracy_vs_loss": fits, "slope_vs_tokens": slopes,
            "gain_vs_tokens": gains,
            "shared_batches": {m: shared_batch_correlation(cells, m) for m in METHODS},
            "difficulty": difficulty_change(cells, rng, resamples)}


# --- report ------------------------------------------------------------------------------------

def _fit_cell(fit: dict | None) -> list[str]:
    """A fitted line's slope, its 95% interval, R^2 and whether the interval excludes 0."""
    if fit is None:
        return ["-", "-", "-", "-"]
    verdict = ("excludes 0" if fit["slope_ci"][0] > 0 or fit["slope_ci"][1] < 0
               else "includes 0")
    return [signed(fit["slope"], 3), bracket(fit["slope_ci"], lambda x: signed(x, 3)),
            fixed(fit["r2"], 2), verdict]


def _compute(result: dict) -> list:
    """The study's stage seconds (summed over every invocation that ran a stage) and this
    invocation's wall time, when the study recorded them."""
    secs = dict(result.get("stage_seconds") or {})
    if not secs:
        return []
    total = secs.pop("total")
    parts = ", ".join(f"{kind} {s:,.0f} s" for kind, s in secs.items())
    wall = (f"; this invocation's wall time {result['wall_s']:,.0f} s"
            if "wall_s" in result else "")
    return [Paragraph(f"Compute: {total:,.0f} s of stages, summed over every invocation that "
                      f"ran one ({parts}){wall}.")]


def blocks(result: dict, figures: dict[str, str], title: str) -> list:
    rows = result["builds"]
    slope = lambda x: signed(x, 4)  # noqa: E731 (reward slopes and held-out gains)
    out = [Heading(1, title),
           Paragraph(f"{len(rows)} builds. Accuracy is held-out pass@1 (seed means after "
                     f"post-training); the reward slope is training reward per 1,000 generated "
                     f"samples; the gain is held-out pass@1 after minus before per 1,000 "
                     f"generated samples."),
           *_compute(result),
           Table(["build", "parameters", "pretraining steps", "tokens (M)", "held-out loss",
                  "base pass@1", "GRPO pass@1", "ES pass@1", "base pass@k", "GRPO pass@k",
                  "ES pass@k", "GRPO slope", "ES slope", "GRPO gain", "ES gain"],
                 [[r["cell"], f"{r['parameters']:,}", str(r["steps"]),
                   f"{r['tokens'] / 1e6:.2f}", f"{r['heldout_loss']:.4f}",
                   pct(r["base_pass@1"]), pct(r["grpo_pass@1"]), pct(r["es_pass@1"]),
                   pct(r["base_pass@k"]), pct(r["grpo_pass@k"]), pct(r["es_pass@k"]),
                   slope(r["grpo_slope"]), slope(r["es_slope"]), slope(r["grpo_gain"]),
                   slope(r["es_gain"])] for r in rows]),
           Heading(2, "Accuracy against pretraining loss"),
           Table(["model", "slope (pass@1 per nat)", "95% CI", "R^2", "the interval"],
                 [[m] + _fit_cell(result["accuracy_vs_loss"][m]) for m in ("base", *METHODS)]),
           Figure(figures["loss"], "Held-out pass@1 against each build's held-out-stream loss, "
                  "least-squares lines with 95% confidence bands."),
           Heading(2, "Reward slope against pretraining tokens"),
           Table(["method", "slope (reward per 1k samples per M tokens)", "95% CI", "R^2",
                  "the interval"],
                 [[m] + _fit_cell(result["slope_vs_tokens"][m]) for m in METHODS]),
           Paragraph("Every build's run of a seed draws the same prompt batches in the same "
                     "order. Mean correlation of per-step training rewards between builds: "
                     + "; ".join(f"{m.upper()} " + ("-" if c is None else
                                                     f"{signed(c['mean'], 2)} ({c['pairs']} pairs)")
                                 for m, c in result["shared_batches"].items())
                     + ". Near 1, the slopes measure the batch order as much as learning; the "
                       "held-out gain below is measured on fixed problems."),
           Heading(2, "Held-out gain against pretraining tokens"),
           Table(["method", "slope (pass@1 per 1k samples per M tokens)", "95% CI", "R^2",
                  "the interval"],
                 [[m] + _fit_cell(result["gain_vs_tokens"][m]) for m in METHODS]),
           Figure(figures["slope"], "Each build's training-reward slope (left) and held-out "
                  "gain (right) against its pretraining tokens, with the fitted lines.")]
    return out + _difficulty_blocks(result["difficulty"], figures["difficulty"])


def _difficulty_blocks(d: dict, figure: str) -> list:
    """Per method and bin of the base's probability of the reference answer: the accuracy
    change and the never-solved pairs the method and the base solve."""
    points = lambda x: signed(x, 1, 100)  # noqa: E731 (bounds of a change in points)
    out: list = [Heading(2, "Change by base difficulty"), Paragraph(
        "Every (build, held-out problem) pair, binned by the base model's probability of the "
        "problem's reference answer. Change: mean per-problem accuracy after minus before. "
        "Never solved: pairs with no correct sample in "
        + ("the base's second draw (another sampling seed); method solves and base solves: the "
           "share of them each solves on the evaluation seed, so chance lifts both alike; "
           "beyond: the paired difference." if d.get("null") else
           "the base's own draw (no second draw: chance and the method are not told apart)."))]
    for m in METHODS:
        out.append(Table([f"{m}: bin", "pairs", "base", "after", "change", "95% CI",
                          "never solved", "method solves", "base solves", "beyond", "95% CI"],
                         [[label] + (["0"] + ["-"] * 9 if r is None else
                                     [str(r["pairs"]), pct(r["base"]), pct(r["after"]),
                                      signed_points(r["change"]), bracket(r["change_ci"], points),
                                      str(r["never_solved"]), pct(r["newly_solved"]),
                                      pct(r["base_solved"]), signed_points(r["beyond_base"]),
                                      bracket(r["beyond_base_ci"], points)])
                          for label, r in zip(d["labels"], d[m])]))
    out.append(Figure(figure, "Per bin of the base's probability of the reference answer: "
                      "mean accuracy change (left) and the never-solved pairs each model "
                      "solves (right)."))
    return out


def draw(result: dict, folder: Path) -> dict[str, str]:
    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    rows, colors = result["builds"], {"base": "#777777", "grpo": "#d62728", "es": "#1f77b4"}
    names = {}
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for m in ("base", *METHODS):
        pts = [(r["heldout_loss"], r[f"{m}_pass@1"]) for r in rows if r[f"{m}_pass@1"] is not None]
        ax.scatter([x for x, _ in pts], [y for _, y in pts], color=colors[m], label=m, s=20)
        fit = result["accuracy_vs_loss"][m]
        if fit is not None:
            xs = np.linspace(min(x for x, _ in pts), max(x for x, _ in pts), 50)
            lo, hi = line_band(fit, xs)
            ax.plot(xs, fit["intercept"] + fit["slope"] * xs, color=colors[m], lw=1)
            ax.fill_between(xs, lo, hi, color=colors[m], alpha=0.12)
    ax.set_xlabel("held-out pretraining loss (nats per token)")
    ax.set_ylabel("held-out pass@1")
    ax.legend()
    names["loss"] = save_figure(fig, folder / "accuracy_vs_loss.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, key, fits, label in ((axes[0], "slope", "slope_vs_tokens",
                                  "training reward per 1k samples"),
                                 (axes[1], "gain", "gain_vs_tokens",
                                  "held-out pass@1 gain per 1k samples")):
        for m in METHODS:
            pts = [(r["tokens"] / 1e6, r[f"{m}_{key}"]) for r in rows
                   if r[f"{m}_{key}"] is not None]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], color=colors[m], label=m, s=20)
            fit = result[fits][m]
            if fit is not None:
                xs = np.linspace(min(x for x, _ in pts), max(x for x, _ in pts), 50)
                ax.plot(xs, fit["intercept"] + fit["slope"] * xs, color=colors[m], lw=1)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xlabel("pretraining tokens (millions)")
        ax.set_ylabel(label)
        ax.legend()
    names["slope"] = save_figure(fig, folder / "slope_vs_tokens.png")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.0))
    d, width = result["difficulty"], 0.27
    # The base's share on the never-solved pairs (the same in every method's rows).
    bars = {"change": [(m, m, "change") for m in METHODS],
            "solved": [(m, m, "newly_solved") for m in METHODS] + [("base", METHODS[0],
                                                                    "base_solved")]}
    for ax, panel, label in ((axes[0], "change", "accuracy change (points)"),
                             (axes[1], "solved", "never-solved pairs solved (%)")):
        for i, (name, m, key) in enumerate(bars[panel]):
            vals = [0.0 if r is None or r[key] is None else 100 * r[key] for r in d[m]]
            ax.bar(np.arange(len(vals)) + (i - (len(bars[panel]) - 1) / 2) * width, vals,
                   width, color=colors[name], label=name)
        ax.set_xticks(range(len(d["labels"])), d["labels"], fontsize=8)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_ylabel(label)
        ax.legend()
    names["difficulty"] = save_figure(fig, folder / "difficulty.png")
    return names


def write(result: dict, out: Path, title: str) -> None:
    """``scaling.json``, ``report.md``, ``report.html`` and ``figures/`` in ``out``."""
    figures = draw(result, out / "figures")
    write_json_atomic(out / "scaling.json", {**result, "figures": figures})
    write_report(out, blocks(result, figures, title))
