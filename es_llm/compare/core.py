"""The sections every comparison has, all from the core comparison of the sample sets
(``analysis.compare_sets``): the summary (which computes it), pass@k, coverage and
diversity."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from es_llm.compare.analysis import compare_sets
from es_llm.compare.section import SECTIONS, Section, SectionInput, always, fields_dict
from es_llm.report import (Figure, Heading, Paragraph, Table, colors, count, difference,
                           fixed, in_points, interval, number, pct, pyplot, save_figure,
                           signed_points)

DIVERSITY_ROWS = (("distinct_answers", "distinct final answers"),
                  ("answer_entropy", "answer entropy (nats)"),
                  ("plurality_share", "plurality share"),
                  ("distinct_2", "distinct-2"), ("self_bleu", "self-BLEU"))


# --- summary -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CoreComparison:
    """``compare_sets``'s result: comparison.json's settings, problem ids, per-model stats,
    per-method stats (seed groups) and method pairs."""

    settings: dict
    problem_ids: list
    models: dict
    methods: dict
    pairs: list

    def to_json(self) -> dict:
        return fields_dict(self)


def summarise(inp: SectionInput) -> CoreComparison:
    return CoreComparison(**compare_sets(list(inp.sets), inp.cfg.reference, inp.rng(),
                                         inp.cfg.bootstrap))


def _seed_range(method: dict, k_index: int) -> str:
    vals = [v[k_index] for v in method["passk"]["seed_values"].values()]
    return f" (seeds {pct(min(vals))}..{pct(max(vals))})" if len(vals) > 1 else ""


def _verdict(p: dict, a: str, b: str, word: str, seeds_overlap: bool | None = None) -> str:
    if p["ahead"] == "tie":
        return "no clear difference (CI includes 0)"
    who = a if p["ahead"] == "a" else b
    note = "; training seeds overlap" if seeds_overlap else ""
    return f"**{who}** {word}{note}"


def _overlap(ma: dict, mb: dict, k_index: int) -> bool:
    va = [v[k_index] for v in ma["passk"]["seed_values"].values()]
    vb = [v[k_index] for v in mb["passk"]["seed_values"].values()]
    return max(va) >= min(vb) and max(vb) >= min(va)


def summary_table(comp: dict) -> Table:
    """The plain-language table: per method pair and metric, the two values, the paired
    difference with its 95% CI, the seed ranges and who is ahead (only where the CI says so)."""
    n, methods, rows = comp["settings"]["n"], comp["methods"], []
    for p in comp["pairs"]:
        a, b = p["a"], p["b"]
        ma, mb = methods[a], methods[b]
        for key, label, k_index in (("pass@1", "pass@1", 0), (f"pass@{n}", f"pass@{n} (= coverage)", -1)):
            q = p[key]
            rows.append([f"{a} vs {b}", label, pct(q["a"]) + _seed_range(ma, k_index),
                         pct(q["b"]) + _seed_range(mb, k_index),
                         difference(q["diff"], q["ci95"], in_points) + " pts",
                         _verdict(q, a, b, "ahead", _overlap(ma, mb, k_index))])
        for key, label, word in (("answer_entropy", "answer entropy (nats)", "more diverse"),
                                 ("distinct_correct", "distinct correct solutions", "more diverse")):
            q = p[key]
            rows.append([f"{a} vs {b}", label, number(q["a"]), number(q["b"]),
                         difference(q["diff"], q["ci95"], lambda x: fixed(x, 3)),
                         _verdict(q, a, b, word)])
    return Table(["comparison", "metric", "first", "second", "first - second [95% CI]",
                  "verdict"], rows)


def in_words(comp: dict) -> list[str]:
    """One sentence per method pair, saying only what the intervals support."""
    n, lines = comp["settings"]["n"], []
    for p in comp["pairs"]:
        a, b = p["a"], p["b"]
        parts = []
        for key, label in (("pass@1", "pass@1"), (f"pass@{n}", f"pass@{n}")):
            q = p[key]
            ci = f"{in_points(q['ci95'][0])}..{in_points(q['ci95'][1])} pts"
            if q["ahead"] == "tie":
                parts.append(f"no clear difference on {label} ({a} - {b} = "
                             f"{'+' if q['diff'] >= 0 else ''}{in_points(q['diff'])}, CI {ci})")
            else:
                who = a if q["ahead"] == "a" else b
                parts.append(f"{who} ahead on {label} by {in_points(abs(q['diff']))} pts (CI of "
                             f"{a} - {b}: {ci})")
        q = p["answer_entropy"]
        parts.append("answer entropy not clearly different" if q["ahead"] == "tie" else
                     f"{a if q['ahead'] == 'a' else b} answers more diversely (answer entropy "
                     f"{a} {q['a']:.2f}, {b} {q['b']:.2f} nats)")
        if p["crossover_k"]:
            resolved = p["pass@1"]["ahead"] != "tie" or p[f"pass@{n}"]["ahead"] != "tie"
            parts.append(f"their mean pass@k curves cross at k = {p['crossover_k']}"
                         + ("" if resolved else ", a crossing within noise"))
        lines.append(f"**{a} vs {b}**: " + "; ".join(parts) + ".")
    return lines


def summary_blocks(comp: dict, figures: dict[str, str]) -> list:
    s, n = comp["settings"], comp["settings"]["n"]
    return [Heading(1, "es-llm comparison report"), Paragraph(
        f"{s['num_problems']} problems of task {s.get('task', '?')}, n = {n} samples per "
        f"problem at temperature {s.get('temperature', '?')} (seed {s.get('seed', '?')}, at "
        f"most {s.get('max_tokens', '?')} tokens), identical for every model. Intervals are 95% "
        f"paired bootstrap intervals over problems ({s['bootstrap_resamples']} resamples) of "
        f"seed-averaged per-problem values; the spread across training seeds is shown beside "
        f"them. A side is called ahead only where its interval excludes 0."),
        Heading(2, "Summary"), summary_table(comp), *map(Paragraph, in_words(comp))]


SECTIONS.register("summary")(Section(place=10, enabled=always, compute=summarise,
                                     blocks=summary_blocks))


# --- pass@k ------------------------------------------------------------------------------------

def passk_curves(comp: dict, path: Path) -> str:
    """pass@k for k = 1..n, each method's seed mean with its 95% band; thin lines per seed."""
    plt = pyplot()
    methods = comp["methods"]
    color = colors(list(methods))
    fig, (ax, axd) = plt.subplots(1, 2, figsize=(11, 4.2))
    base = methods[comp["settings"]["base"]]["passk"]
    for name, m in methods.items():
        ks, mean = m["passk"]["k"], np.array(m["passk"]["mean"])
        ax.plot(ks, mean, color=color[name], label=f"{name} ({len(m['models'])} seed"
                f"{'s' if len(m['models']) > 1 else ''})")
        ax.fill_between(ks, m["passk"]["lo"], m["passk"]["hi"], color=color[name], alpha=0.2)
        if len(m["models"]) > 1:
            for vals in m["passk"]["seed_values"].values():
                ax.plot(ks, vals, color=color[name], lw=0.6, ls="--", alpha=0.7)
        axd.plot(ks, mean - np.array(base["mean"]), color=color[name], label=name)
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
    return save_figure(fig, path)


def passk_blocks(comp: dict, figures: dict[str, str]) -> list:
    methods, n = comp["methods"], comp["settings"]["n"]
    ks = [k for k in methods[comp["settings"]["base"]]["passk"]["k"] if k & (k - 1) == 0 or k == n]
    rows = [[f"{k}"] + [interval(m["passk"]["mean"][k - 1],
                                 [m["passk"]["lo"][k - 1], m["passk"]["hi"][k - 1]], pct)
                        for m in methods.values()] for k in ks]
    cross = [f"{p['a']} vs {p['b']}: " + (f"the order at k = 1 flips at k = {p['crossover_k']}"
                                          if p["crossover_k"] else "no crossover up to k = n")
             for p in comp["pairs"]]
    return [Heading(2, "pass@k"),
            Figure(figures["passk"], f"pass@k for k = 1..{n} (seed means with 95% bootstrap "
                   f"bands; dashed: single training seeds) and the difference to the base model."),
            Table(["k"] + list(methods), rows),
            Paragraph("Crossover (seed-mean curves): " + "; ".join(cross) + ".")]


SECTIONS.register("passk")(Section(
    place=80, enabled=always, blocks=passk_blocks,
    figures=lambda comp, folder: {"passk": passk_curves(comp, folder / "passk.png")}))


# --- coverage ----------------------------------------------------------------------------------

def coverage(comp: dict, path: Path) -> str:
    """Left: problems solved at least once per model. Right: overlap of each method pair."""
    plt = pyplot()
    models, pairs = comp["models"], comp["pairs"]
    fig, (ax, axo) = plt.subplots(1, 2, figsize=(11, 4.2))
    color = colors(list(comp["methods"]))
    names = list(models)
    ax.bar(names, [models[n]["num_solved"] for n in names],
           color=[color[models[n]["method"]] for n in names])
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
    return save_figure(fig, path)


def histograms(comp: dict, path: Path) -> str:
    """Per-problem accuracy histogram of each method (seed-averaged shares)."""
    plt = pyplot()
    methods = comp["methods"]
    color = colors(list(methods))
    labels = next(iter(methods.values()))["histogram"]["labels"]
    x = np.arange(len(labels))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(11, 4))
    for i, (name, m) in enumerate(methods.items()):
        ax.bar(x + i * width, m["histogram"]["shares"], width, color=color[name], label=name)
    ax.set_xticks(x + 0.4 - width / 2, labels, rotation=30)
    ax.set_xlabel("per-problem accuracy (share of the n samples that are correct)")
    ax.set_ylabel("share of problems")
    ax.set_title("per-problem accuracy histogram")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def coverage_blocks(comp: dict, figures: dict[str, str]) -> list:
    methods, n = comp["methods"], comp["settings"]["n"]
    out = [Heading(2, "Coverage"),
           Figure(figures["coverage"], f"Problems solved at least once in n = {n} samples, "
                  f"and the overlap of each pair of methods."),
           Table(["pair", "only first", "both", "only second", "neither"],
                 [[f"{p['a']} vs {p['b']}"] + [count(p["overlap"][k]) for k in (
                     "num_only_a", "num_both", "num_only_b", "num_neither")]
                  for p in comp["pairs"]])]
    trained = [m for m in methods if "vs_base" in methods[m]]
    if trained:
        out.append(Paragraph("Progressions are problems the base model never solves and the "
                             "trained model solves at least once; regressions the reverse. The "
                             "answer entropy on regressions is low when the trained model is "
                             "confidently wrong there."))
        out.append(Table(["method", "progressions", "share of the base's never-solved",
                          "regressions", "mean accuracy change",
                          "answer entropy on regressions", "plurality share on regressions"],
                         [[m, count(methods[m]["vs_base"]["num_progressions"]),
                           pct(methods[m]["vs_base"]["progression_share"]),
                           count(methods[m]["vs_base"]["num_regressions"]),
                           signed_points(methods[m]["vs_base"]["accuracy_delta"]),
                           number(methods[m]["vs_base"]["regression_entropy"]),
                           number(methods[m]["vs_base"]["regression_plurality"])]
                          for m in trained]))
    out.append(Figure(figures["histograms"], "Per-problem accuracy histogram (the first bin "
                      "holds the problems never solved)."))
    return out


SECTIONS.register("coverage")(Section(
    place=90, enabled=always, blocks=coverage_blocks,
    figures=lambda comp, folder: {"coverage": coverage(comp, folder / "coverage.png"),
                                  "histograms": histograms(comp, folder / "accuracy_histogram.png")}))


# --- diversity ---------------------------------------------------------------------------------

def diversity(comp: dict, path: Path) -> str:
    """Diversity per method: answers, text and correct solutions, and progressions /
    regressions against the base model."""
    plt = pyplot()
    methods = comp["methods"]
    color = colors(list(methods))
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
                   color=[color[n] for n in names])
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=30)
    return save_figure(fig, path)


def diversity_blocks(comp: dict, figures: dict[str, str]) -> list:
    methods = comp["methods"]
    header = ["metric"] + [f"{m} (all)" for m in methods] + [f"{m} (correct)" for m in methods]
    rows = [[label] + [number(methods[m]["diversity"]["all"][key]) for m in methods]
            + [number(methods[m]["diversity"]["correct"][key]) for m in methods]
            for key, label in DIVERSITY_ROWS]
    rows.append(["distinct correct solutions"]
                + [number(methods[m]["diversity"]["distinct_correct_solutions"]) for m in methods]
                + ["" for _ in methods])
    return [Heading(2, "Diversity"),
            Figure(figures["diversity"], "Diversity per method (seed means) and progressions / "
                   "regressions against the base model."),
            Table(header, rows)]


SECTIONS.register("diversity")(Section(
    place=100, enabled=always, blocks=diversity_blocks,
    figures=lambda comp, folder: {"diversity": diversity(comp, folder / "diversity.png")}))
