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
  source: that share is also given beyond a null, the base sampled again on another seed
  (the ``redraw`` arm), since problems picked for having no hit in n samples come up in the
  next n by chance alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from es_llm.io import write_json_atomic, write_text_atomic
from es_llm.metrics.fits import curve_slope, line_band, linear_fit
from es_llm.metrics.passk import bootstrap_ci

METHODS = ("grpo", "es")
# The base evaluated again on another sampling seed: the null arm of "newly solved".
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


def _bin_row(acc: np.ndarray, hit: np.ndarray, base: np.ndarray, null_hit: np.ndarray,
             sel: np.ndarray, rng: np.random.Generator, resamples: int) -> dict:
    """One bin of one arm: accuracy change over the ``sel`` pairs, and on the base's
    never-solved ones the share solved (``hit``: the share of the arm's seeds with a correct
    sample, so three seeds get no more tries than one), the null's (the redraw's) share, and
    the paired difference, each with a bootstrap interval over pairs."""
    never = sel & (base == 0)
    solved = hit[never]
    paired = never & np.isfinite(null_hit)
    beyond = hit[paired] - null_hit[paired]
    change = acc[sel] - base[sel]
    return {"pairs": int(sel.sum()), "base": float(base[sel].mean()),
            "after": float(acc[sel].mean()), "change": float(change.mean()),
            "change_ci": list(bootstrap_ci(change, rng, resamples)),
            "never_solved": int(never.sum()),
            "newly_solved": float(solved.mean()) if solved.size else None,
            "newly_solved_ci": list(bootstrap_ci(solved, rng, resamples)) if solved.size else None,
            "redraw_solved": float(null_hit[paired].mean()) if beyond.size else None,
            "beyond_redraw": float(beyond.mean()) if beyond.size else None,
            "beyond_redraw_ci": list(bootstrap_ci(beyond, rng, resamples)) if beyond.size else None}


def difficulty_change(cells: list[dict], rng: np.random.Generator, resamples: int) -> dict:
    """Per arm (each method, and ``redraw``: the base sampled again on another seed) and bin
    of the base's log-probability of the reference: the pairs, the base's and the arm's
    mean accuracy, the mean change, the share of the base's never-solved pairs solved, and
    that share beyond the redraw's on the same pairs (a problem the base never solved in n
    samples can come up in the next n by chance alone), with bootstrap intervals over
    pairs."""
    arms = (*METHODS, NULL_ARM)
    base_logp, base_acc = [], []
    arm_acc, arm_hit = {m: [] for m in arms}, {m: [] for m in arms}
    for c in cells:
        n_b = c["models"]["base"]["n"]
        base_logp += c["reference_logp"]
        base_acc += [x / n_b for x in c["models"]["base"]["correct_P"]]
        for m in arms:
            seeds = [v for k, v in c["models"].items() if k.split("@")[0] == m]
            if not seeds:
                arm_acc[m] += [math.nan] * len(c["reference_logp"])
                arm_hit[m] += [math.nan] * len(c["reference_logp"])
                continue
            correct_S_P = np.asarray([s["correct_P"] for s in seeds], dtype=np.float64)
            n_S = np.asarray([[s["n"]] for s in seeds], dtype=np.float64)
            arm_acc[m] += (correct_S_P / n_S).mean(axis=0).tolist()
            arm_hit[m] += (correct_S_P > 0).mean(axis=0).tolist()
    log10 = np.asarray(base_logp) / math.log(10)
    bins = np.digitize(log10, LOG10_EDGES)
    base, null_hit = np.asarray(base_acc), np.asarray(arm_hit[NULL_ARM])
    out = {"labels": list(BIN_LABELS), "pairs": [int((bins == b).sum())
                                                 for b in range(len(BIN_LABELS))]}
    for m in arms:
        acc, hit = np.asarray(arm_acc[m]), np.asarray(arm_hit[m])
        out[m] = [_bin_row(acc, hit, base, null_hit, (bins == b) & np.isfinite(acc), rng,
                           resamples)
                  if ((bins == b) & np.isfinite(acc)).any() else None
                  for b in range(len(BIN_LABELS))]
    return out


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

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(lo_hi, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if lo_hi is None else f"[{scale * lo_hi[0]:+.{digits}f}, {scale * lo_hi[1]:+.{digits}f}]"


def _fit_cell(fit: dict | None, scale: float = 1.0) -> list[str]:
    if fit is None:
        return ["-", "-", "-", "-"]
    verdict = ("excludes 0" if fit["slope_ci"][0] > 0 or fit["slope_ci"][1] < 0
               else "includes 0")
    r2 = "-" if fit["r2"] is None else f"{fit['r2']:.2f}"
    return [f"{scale * fit['slope']:+.3f}", _ci(fit["slope_ci"], scale), r2, verdict]


def _compute(result: dict) -> list[tuple]:
    """The study's stage seconds (summed over every invocation that ran a stage) and this
    invocation's wall time, when the study recorded them."""
    secs = dict(result.get("stage_seconds") or {})
    if not secs:
        return []
    total = secs.pop("total")
    parts = ", ".join(f"{kind} {s:,.0f} s" for kind, s in secs.items())
    wall = (f"; this invocation's wall time {result['wall_s']:,.0f} s"
            if "wall_s" in result else "")
    return [("p", f"Compute: {total:,.0f} s of stages, summed over every invocation that "
                  f"ran one ({parts}){wall}.")]


def blocks(result: dict, figures: dict[str, str], title: str) -> list[tuple]:
    rows = result["builds"]
    out = [("h", 1, title),
           ("p", f"{len(rows)} builds. Accuracy is held-out pass@1 (seed means after "
                 f"post-training); the reward slope is training reward per 1,000 generated "
                 f"samples; the gain is held-out pass@1 after minus before per 1,000 "
                 f"generated samples."),
           *_compute(result),
           ("table", ["build", "parameters", "pretraining steps", "tokens (M)",
                      "held-out loss", "base pass@1", "GRPO pass@1", "ES pass@1",
                      "base pass@k", "GRPO pass@k", "ES pass@k", "GRPO slope", "ES slope",
                      "GRPO gain", "ES gain"],
            [[r["cell"], f"{r['parameters']:,}", str(r["steps"]), f"{r['tokens'] / 1e6:.2f}",
              f"{r['heldout_loss']:.4f}", _pct(r["base_pass@1"]), _pct(r["grpo_pass@1"]),
              _pct(r["es_pass@1"]), _pct(r["base_pass@k"]), _pct(r["grpo_pass@k"]),
              _pct(r["es_pass@k"]), _num(r["grpo_slope"]), _num(r["es_slope"]),
              _num(r["grpo_gain"]), _num(r["es_gain"])]
             for r in rows]),
           ("h", 2, "Accuracy against pretraining loss"),
           ("table", ["model", "slope (pass@1 per nat)", "95% CI", "R^2", "the interval"],
            [[m] + _fit_cell(result["accuracy_vs_loss"][m]) for m in ("base", *METHODS)]),
           ("img", figures["loss"], "Held-out pass@1 against each build's held-out-stream loss, "
                                    "least-squares lines with 95% confidence bands."),
           ("h", 2, "Reward slope against pretraining tokens"),
           ("table", ["method", "slope (reward per 1k samples per M tokens)", "95% CI", "R^2",
                      "the interval"],
            [[m] + _fit_cell(result["slope_vs_tokens"][m]) for m in METHODS]),
           ("p", "Every build's run of a seed draws the same prompt batches in the same "
                 "order. Mean correlation of per-step training rewards between builds: "
                 + "; ".join(f"{m.upper()} " + ("-" if c is None else
                                                 f"{c['mean']:+.2f} ({c['pairs']} pairs)")
                             for m, c in result["shared_batches"].items())
                 + ". Near 1, the slopes measure the batch order as much as learning; the "
                   "held-out gain below is measured on fixed problems."),
           ("h", 2, "Held-out gain against pretraining tokens"),
           ("table", ["method", "slope (pass@1 per 1k samples per M tokens)", "95% CI", "R^2",
                      "the interval"],
            [[m] + _fit_cell(result["gain_vs_tokens"][m]) for m in METHODS]),
           ("img", figures["slope"], "Each build's training-reward slope (left) and held-out "
                                     "gain (right) against its pretraining tokens, with the "
                                     "fitted lines.")]
    d = result["difficulty"]
    out += [("h", 2, "Change by base difficulty"),
            ("p", "Every (build, held-out problem) pair, binned by the base model's probability "
                  "of the problem's reference answer. Change: mean per-problem accuracy after "
                  "minus before; newly solved: share of the base's never-solved pairs the "
                  "method solves at least once; redraw: the same share for the base sampled "
                  "again on another seed (what chance alone surfaces); beyond: newly solved "
                  "minus redraw on the same pairs, paired.")]
    for m in METHODS:
        out.append(("table", [f"{m}: bin", "pairs", "base", "after", "change", "95% CI",
                              "never solved", "newly solved", "redraw", "beyond", "95% CI"],
                    [[label] + (["0"] + ["-"] * 9 if r is None else
                                [str(r["pairs"]), _pct(r["base"]), _pct(r["after"]),
                                 f"{100 * r['change']:+.1f} pts", _ci(r["change_ci"], 100, 1),
                                 str(r["never_solved"]), _pct(r["newly_solved"]),
                                 _pct(r["redraw_solved"]),
                                 "-" if r["beyond_redraw"] is None
                                 else f"{100 * r['beyond_redraw']:+.1f} pts",
                                 _ci(r["beyond_redraw_ci"], 100, 1)])
                     for label, r in zip(d["labels"], d[m])]))
    out.append(("img", figures["difficulty"], "Mean accuracy change per bin of the base's "
                                              "probability of the reference answer."))
    return out


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:+.4f}"


def draw(result: dict, folder: Path) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    names["loss"] = _save(fig, folder / "accuracy_vs_loss.png")
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
    names["slope"] = _save(fig, folder / "slope_vs_tokens.png")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.0))
    d, width = result["difficulty"], 0.27
    colors[NULL_ARM] = "#999999"
    for ax, key, arms, label in ((axes[0], "change", METHODS, "accuracy change (points)"),
                                 (axes[1], "newly_solved", (*METHODS, NULL_ARM),
                                  "base's never-solved pairs solved (%)")):
        for i, m in enumerate(arms):
            vals = [0.0 if r is None or r[key] is None else 100 * r[key] for r in d[m]]
            ax.bar(np.arange(len(vals)) + (i - (len(arms) - 1) / 2) * width, vals, width,
                   color=colors[m], label=m)
        ax.set_xticks(range(len(d["labels"])), d["labels"], fontsize=8)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_ylabel(label)
        ax.legend()
    names["difficulty"] = _save(fig, folder / "difficulty.png")
    return names


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path.name


def write(result: dict, out: Path, title: str) -> None:
    """``scaling.json``, ``report.md``, ``report.html`` and ``figures/`` in ``out``."""
    from es_llm.compare.report import to_html, to_markdown

    figures = draw(result, out / "figures")
    items = blocks(result, figures, title)
    write_json_atomic(out / "scaling.json", {**result, "figures": figures})
    write_text_atomic(out / "report.md", to_markdown(items))
    write_text_atomic(out / "report.html", to_html(items))
