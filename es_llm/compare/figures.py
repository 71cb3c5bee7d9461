"""The report's PNG figures, drawn from the comparison dict alone (so a figure can never
show a number that comparison.json does not hold)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _colors(methods: list[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(methods)}


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def passk_curves(comp: dict, path: Path) -> str:
    """pass@k for k = 1..n, each method's seed mean with its 95% band; thin lines per seed."""
    methods = comp["methods"]
    colors = _colors(list(methods))
    fig, (ax, axd) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = methods[comp["settings"]["base"]]["passk"]
    for name, m in methods.items():
        ks, mean = m["passk"]["k"], np.array(m["passk"]["mean"])
        ax.plot(ks, mean, color=colors[name], label=f"{name} ({len(m['models'])} seed"
                f"{'s' if len(m['models']) > 1 else ''})")
        ax.fill_between(ks, m["passk"]["lo"], m["passk"]["hi"], color=colors[name], alpha=0.2)
        if len(m["models"]) > 1:
            for vals in m["passk"]["seed_values"].values():
                ax.plot(ks, vals, color=colors[name], lw=0.6, ls="--", alpha=0.7)
        axd.plot(ks, mean - np.array(base["mean"]), color=colors[name], label=name)
    for a in (ax, axd):
        a.set_xscale("log", base=2)
        a.set_xlabel("k (samples per problem)")
        a.grid(alpha=0.3)
    ax.set_ylabel("pass@k")
    ax.set_title("pass@k, 95% bootstrap band over problems")
    axd.axhline(0.0, color="black", lw=0.8)
    axd.set_ylabel(f"pass@k minus {comp['settings']['base']}")
    axd.set_title("difference to the base model (seed means)")
    ax.legend(fontsize=8)
    axd.legend(fontsize=8)
    return _save(fig, path)


def coverage(comp: dict, path: Path) -> str:
    """Left: problems solved at least once per model. Right: overlap of each method pair."""
    models, pairs = comp["models"], comp["pairs"]
    fig, (ax, axo) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = _colors(list(comp["methods"]))
    names = list(models)
    ax.bar(names, [models[n]["num_solved"] for n in names],
           color=[colors[models[n]["method"]] for n in names])
    ax.set_ylabel(f"problems solved at least once (of {comp['settings']['num_problems']})")
    ax.set_title(f"coverage at n = {comp['settings']['n']}")
    ax.tick_params(axis="x", rotation=45)
    labels = [f"{p['a']} vs {p['b']}" for p in pairs]
    only_a = [p["overlap"]["num_only_a"] for p in pairs]
    both = [p["overlap"]["num_both"] for p in pairs]
    only_b = [p["overlap"]["num_only_b"] for p in pairs]
    y = np.arange(len(pairs))
    axo.barh(y, only_a, color="tab:green", label="only the first")
    axo.barh(y, both, left=only_a, color="lightgray", label="both")
    axo.barh(y, only_b, left=np.add(only_a, both), color="tab:red", label="only the second")
    axo.set_yticks(y, labels)
    axo.set_xlabel("problems (mean over seed pairings)")
    axo.set_title("which problems each one solves")
    axo.legend(fontsize=8)
    return _save(fig, path)


def histograms(comp: dict, path: Path) -> str:
    """Per-problem accuracy histogram of each method (seed-averaged shares)."""
    methods = comp["methods"]
    colors = _colors(list(methods))
    labels = next(iter(methods.values()))["histogram"]["labels"]
    x = np.arange(len(labels))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(11, 4))
    for i, (name, m) in enumerate(methods.items()):
        ax.bar(x + i * width, m["histogram"]["shares"], width, color=colors[name], label=name)
    ax.set_xticks(x + 0.4 - width / 2, labels, rotation=30)
    ax.set_xlabel("per-problem accuracy (share of the n samples that are correct)")
    ax.set_ylabel("share of problems")
    ax.set_title("per-problem accuracy histogram")
    ax.legend(fontsize=8)
    return _save(fig, path)


def diversity(comp: dict, path: Path) -> str:
    """Diversity per method: answers, text and correct solutions, and progressions /
    regressions against the base model."""
    methods = comp["methods"]
    colors = _colors(list(methods))
    names = list(methods)
    panels = [
        ("distinct final answers", lambda m: m["diversity"]["all"]["distinct_answers"]),
        ("answer entropy (nats)", lambda m: m["diversity"]["all"]["answer_entropy"]),
        ("distinct-2 (all samples)", lambda m: m["diversity"]["all"]["distinct_2"]),
        ("self-BLEU (lower = more diverse)", lambda m: m["diversity"]["all"]["self_bleu"]),
        ("distinct correct solutions", lambda m: m["diversity"]["distinct_correct_solutions"]),
        ("progressions / regressions vs base", None),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (title, get) in zip(axes.flat, panels):
        if get is None:
            trained = [n for n in names if "vs_base" in methods[n]]
            x = np.arange(len(trained))
            ax.bar(x - 0.2, [methods[n]["vs_base"]["num_progressions"] for n in trained], 0.4,
                   color="tab:green", label="progressions")
            ax.bar(x + 0.2, [methods[n]["vs_base"]["num_regressions"] for n in trained], 0.4,
                   color="tab:red", label="regressions")
            ax.set_xticks(x, trained)
            ax.legend(fontsize=8)
        else:
            vals = [get(methods[n]) for n in names]
            ax.bar(names, [v if v is not None else 0.0 for v in vals],
                   color=[colors[n] for n in names])
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=30)
    return _save(fig, path)


def training(comp: dict, path: Path) -> str | None:
    """Training reward against generated samples for every run that has a curve."""
    curves = comp.get("training") or {}
    if not curves:
        return None
    colors = _colors(list(comp["methods"]))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    seen = set()
    for name, c in curves.items():
        method = name.split("@")[0]
        color = colors.get(method, "black")
        ax.plot(c["samples"], c["reward"], color=color, lw=0.6, alpha=0.35)
        # A trailing mean over a tenth of the run shows the trend under per-step noise.
        window = max(1, len(c["reward"]) // 10)
        smooth = np.convolve(c["reward"], np.ones(window) / window, mode="valid")
        ax.plot(c["samples"][window - 1:], smooth, color=color, lw=1.6,
                label=f"{method}: {c['metric']} (trailing mean of {window})"
                if method not in seen else None)
        seen.add(method)
    ax.set_xlabel("generated samples")
    ax.set_ylabel("training reward")
    ax.set_title("training curves (one line per training seed; faint: every step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def capability(cap: dict, path: Path) -> str:
    """One panel per problem set: each method's greedy accuracy beside its sampled pass@1 at
    every temperature (seed means), so a gain in the sampled bars that the greedy bar does not
    share reads as sharpening."""
    sets, temps = cap["sets"], cap["temperatures"]
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4.2), squeeze=False)
    bars = ["greedy"] + [f"pass@1 {t}" for t in temps]
    width = 0.8 / len(bars)
    for ax, entry in zip(axes[0], sets):
        methods = list(entry["methods"])
        x = np.arange(len(methods))
        for i, bar in enumerate(bars):
            values = []
            for m in methods:
                info = entry["methods"][m]
                v = info["greedy"] if i == 0 else info["sampled"].get(temps[i - 1], {}).get("pass@1")
                values.append(np.nan if v is None else 100 * v)
            ax.bar(x + (i - (len(bars) - 1) / 2) * width, values, width, label=bar)
        ax.set_xticks(x, methods)
        ax.set_ylabel("% of problems")
        ax.set_title(f"{entry['data']} ({entry['num_problems']} problems)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    return _save(fig, path)


def difficulty(diff: dict, path: Path) -> str:
    """Accuracy per base-difficulty bin, one bar per method (seed means)."""
    methods = list(diff["methods"])
    labels = diff["bins"]
    x = np.arange(len(labels))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = _colors(methods)
    for i, m in enumerate(methods):
        ys = [np.nan if g["accuracy"] is None else 100 * g["accuracy"]
              for g in diff["methods"][m]["by_bin"]]
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, ys, width, label=m, color=colors[m])
    counts = [g["problems"] for g in diff["methods"][methods[0]]["by_bin"]]
    ax.set_xticks(x, [f"{lab}\n({c})" for lab, c in zip(labels, counts)])
    ax.set_xlabel(f"base difficulty: {diff['reference']}'s failure rate (problems)")
    ax.set_ylabel("accuracy per sample, %")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path)


def blind_spot(spot: dict, path: Path) -> str:
    """Per model: greedy alone and recovered by any chain, as % of its never-sampled
    problems."""
    names = list(spot["models"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(names) + 2), 4))
    for offset, key, label in ((-0.2, "greedy", "greedy alone"), (0.2, "recovered", "any chain")):
        ys = [100 * m[key] / m["diagnosed"] if m["diagnosed"] else np.nan
              for m in spot["models"].values()]
        ax.bar(x + offset, ys, 0.4, label=label)
    ax.set_xticks(x, [f"{n}\n({m['diagnosed']})" for n, m in spot["models"].items()])
    ax.set_ylabel("% of never-sampled problems solved")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _budget_value(p: dict, stat: str) -> float:
    return p["stats"]["greedy"]["a"] if stat == "greedy" else p["stats"]["passk"][stat]["a"]


def budget_figure(result: dict, path: Path) -> str:
    """Greedy accuracy and sampled pass@k of the budget study (``budget.study``) against
    generated samples (left) and training seconds (right): each seed thin, the seed mean bold
    where every seed of the method has that checkpoint (so a run continued alone does not
    bend the mean)."""
    base, points = result["base"], result["points"]
    panels = [("greedy", f"greedy accuracy ({Path(result['data']).stem})")] + [
        (str(k), f"pass@{k}, T = {result['temperature']:g}") for k in result["k"]]
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.4 * len(panels)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (stat, label), pair in zip(panels, axes):
        base_y = base["greedy"] if stat == "greedy" else base["passk"][stat]
        for ax, axis in zip(pair, ("samples", "seconds")):
            ax.axhline(base_y, color="black", lw=0.8, ls=":", label="reference")
            for i, (method, seeds) in enumerate(points.items()):
                color = colors[i % len(colors)]
                # Every curve starts at the reference model (no training yet).
                for seed in seeds:
                    ax.plot([0.0] + [p[axis] for p in seed], [base_y] + [_budget_value(p, stat)
                            for p in seed], color=color, lw=0.8, alpha=0.35)
                # The summary rows are already seed means; keep those every seed has.
                mean = [r for r in result["rows"]
                        if r["method"] == method and r["seeds"] == len(seeds)]
                xs = [0.0] + [r[axis] for r in mean]
                ys = [base_y] + [r["greedy"] if stat == "greedy" else r["passk"][stat]
                                 for r in mean]
                ax.plot(xs, ys, color=color, lw=2, marker="o",
                        label=f"{method} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
            ax.set_xlabel("generated training samples" if axis == "samples"
                          else "training seconds (same machine)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)


def draw_all(comp: dict, folder: Path) -> dict[str, str]:
    """Every figure into ``folder``; returns figure key -> file name."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {"passk": passk_curves(comp, folder / "passk.png"),
           "coverage": coverage(comp, folder / "coverage.png"),
           "histograms": histograms(comp, folder / "accuracy_histogram.png"),
           "diversity": diversity(comp, folder / "diversity.png")}
    curve = training(comp, folder / "training.png")
    if curve:
        out["training"] = curve
    if comp.get("capability"):
        out["capability"] = capability(comp["capability"], folder / "capability.png")
    if comp.get("blind_spot"):
        out["blind_spot"] = blind_spot(comp["blind_spot"], folder / "blind_spot.png")
    if comp.get("difficulty"):
        out["difficulty"] = difficulty(comp["difficulty"], folder / "difficulty.png")
    if comp.get("testtime"):
        from es_llm.compare.testtime import testtime_figure
        out["testtime"] = testtime_figure(comp["testtime"], folder / "testtime.png")
    if comp.get("budget_study"):
        out["budget_study"] = budget_figure(comp["budget_study"], folder / "budget.png")
    return out
