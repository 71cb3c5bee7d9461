"""Capability or sharpening: the same models read greedily and sampled, on several problem sets.

A gain in sampled pass@1 can be new problems solved, or probability mass moved onto answers
the model already gave greedily (sharpening). The two read differently side by side: per
problem set and method, greedy accuracy (one sample at T = 0), sampled pass@1 and pass@n at
each temperature, the answer entropy, and the sharpening gap, greedy accuracy minus sampled
pass@1 at the same temperature (how much sampling loses against the model's own first
choice; it shrinks when training only sharpens). Against the reference, the problems each
method newly solves greedily and the ones it loses.

A method's values are means over its training seeds. "Newly solved" counts, per seed, the
problems the reference gets wrong greedily and the seed gets right; with a reference of
several seeds, a problem counts as wrong (right) for it when every one of its seeds is wrong
(right).

The comparison section ``capability`` (enabled by ``temperatures`` or ``also_on``), which
samples the views, is at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from es_llm.compare.analysis import Resamples, paired, passk_table, shared_resamples
from es_llm.compare.config import CompareConfig
from es_llm.compare.samples import SampleSet, align, load_samples
from es_llm.compare.sampling import sample_model
from es_llm.compare.section import SECTIONS, CheckInput, Section, SectionInput, fields_dict
from es_llm.errors import BadInput
from es_llm.metrics import answer_entropy
from es_llm.report import (Figure, Heading, Paragraph, Table, count, difference, in_points,
                           number, pct, pyplot, save_figure, signed_points)
from es_llm.tasks import build_task


def view_label(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"T={temperature:g}"


def _by_method(sets: list[SampleSet]) -> dict[str, list[SampleSet]]:
    out: dict[str, list[SampleSet]] = {}
    for s in sets:
        out.setdefault(s.method, []).append(s)
    return out


def _sampled(sets: list[SampleSet]) -> dict:
    """pass@1, pass@n and the mean answer entropy of one method's seeds (seed means)."""
    n = sets[0].n
    tables = [passk_table(s.correct, [1, n]).mean(axis=0) for s in sets]
    entropy = [float(np.nanmean(answer_entropy(s.answer_keys)["entropy_P"])) for s in sets]
    return {"n": n, "pass@1": float(np.mean([t[0] for t in tables])),
            "pass@n": float(np.mean([t[1] for t in tables])),
            "entropy": float(np.mean(entropy))}


def _greedy_vs(reference: list[SampleSet], method: list[SampleSet],
               resamples: Resamples) -> dict:
    """Greedy accuracy of ``method`` against ``reference``: the paired difference of the
    seed-mean correctness per problem, and the problems newly solved and lost (seed means)."""
    ref_P = np.mean([np.array([c[0] for c in s.correct], float) for s in reference], axis=0)
    per_seed = [np.array([c[0] for c in s.correct], float) for s in method]
    gained = [int(np.sum((ref_P == 0) & (m_P == 1))) for m_P in per_seed]
    lost = [int(np.sum((ref_P == 1) & (m_P == 0))) for m_P in per_seed]
    return {"greedy": paired(np.mean(per_seed, axis=0), ref_P, resamples),
            "newly_solved": float(np.mean(gained)), "lost": float(np.mean(lost)),
            "seed_values": {s.name: {"newly_solved": g, "lost": l}
                            for s, g, l in zip(method, gained, lost)}}


def capability(views: list[dict], reference: str, rng: np.random.Generator,
               num_resamples: int = 1000) -> dict:
    """The capability table of a comparison as a JSON-ready dict.

    Args:
        views: one per (problem set, temperature): ``{"data": label, "temperature": T,
            "sets": [SampleSet, ...]}``, the sets aligned (``samples.align``); T = 0 is the
            greedy view (one sample per problem).
        reference: the method (or model) the others are measured against.
    Returns: ``{"reference", "temperatures", "sets": [{"data", "num_problems", "methods":
        {method: {"greedy", "sampled": {label: {...}}, "gap": {label: greedy - pass@1}}},
        "vs_reference": {method: {...}}}]}``; ``greedy`` and ``gap`` are None for a set
        without a greedy view.
    """
    temperatures = sorted({v["temperature"] for v in views if v["temperature"] > 0})
    out_sets = []
    for data in dict.fromkeys(v["data"] for v in views):
        mine = {v["temperature"]: _by_method(v["sets"]) for v in views if v["data"] == data}
        first = next(iter(mine.values()))
        ref = reference.split("@")[0]
        methods = {}
        for method in first:
            greedy = (float(np.mean([np.mean([c[0] for c in s.correct]) for s in mine[0][method]]))
                      if 0 in mine else None)
            sampled = {view_label(t): _sampled(mine[t][method]) for t in temperatures if t in mine}
            methods[method] = {
                "greedy": greedy, "sampled": sampled,
                "gap": {label: None if greedy is None else greedy - s["pass@1"]
                        for label, s in sampled.items()}}
        entry = {"data": data, "num_problems": len(first[ref][0].problem_ids),
                 "methods": methods, "vs_reference": {}}
        if 0 in mine:
            resamples = shared_resamples(len(first[ref][0].problem_ids), rng, num_resamples)
            entry["vs_reference"] = {m: _greedy_vs(mine[0][ref], mine[0][m], resamples)
                                     for m in mine[0] if m != ref}
        out_sets.append(entry)
    return {"reference": reference, "temperatures": [view_label(t) for t in temperatures],
            "sets": out_sets}


# --- the section -------------------------------------------------------------------------------

def views(cfg: CompareConfig) -> list[tuple[str | None, float]]:
    """(data file or None for the task's own, temperature) of every capability view, greedy
    first in each set; [] when capability views are off."""
    if not cfg.temperatures and not cfg.also_on:
        return []
    temps = [0.0] + sorted({*cfg.temperatures, cfg.sampling.temperature} - {0.0})
    return [(data, t) for data in (None, *cfg.also_on) for t in temps]


def check_views(inp: CheckInput) -> None:
    """Capability views sample every model again, so every model must be a folder, and every
    ``also_on`` file must hold problems of the task."""
    cfg, loaded = inp.cfg, inp.loaded
    if loaded:
        raise BadInput(f"temperatures / also_on read every model again, so every model must be "
                       f"a model folder; {', '.join(sorted(loaded))} "
                       f"{'is a samples file' if len(loaded) == 1 else 'are samples files'}.")
    for data in cfg.also_on:
        if not Path(data).is_file():
            raise BadInput(f"also_on file {data!r} does not exist; give problem files of task "
                           f"{cfg.task.name!r} (e.g. from scripts/unseen_countdown.py).")
        task = build_task(replace(cfg.task, data=data))
        try:
            if not task.problems():
                raise BadInput(f"also_on file {data!r} holds no problems.")
        finally:
            task.close()


def view_folders(cfg: CompareConfig, out: Path) -> list[tuple[str, float, Path, CompareConfig]]:
    """(set label, temperature, samples folder, the comparison config of that view) for every
    capability view: greedy views take one sample at T = 0."""
    labels, found = {}, []
    for data, temperature in views(cfg):
        if data not in labels:
            # The comparison's own problems: the task's held-out file unless --data names one.
            main = Path(cfg.task.data).stem if cfg.task.data else "held-out"
            stem = main if data is None else Path(data).stem
            labels[data] = stem if stem not in labels.values() else f"{stem}-{len(labels)}"
        sampling = replace(cfg.sampling, temperature=temperature,
                           n=1 if temperature == 0 else cfg.views_n or cfg.sampling.n)
        view = replace(cfg, sampling=sampling, task=replace(cfg.task, data=data or cfg.task.data))
        folder = out / "samples" / "views" / labels[data] / view_label(temperature).replace("=", "")
        found.append((labels[data], temperature, folder, view))
    return found


@dataclass(frozen=True)
class Capability:
    """comparison.json["capability"], ``capability``'s result."""

    reference: str
    temperatures: list[str]
    sets: list[dict]

    def to_json(self) -> dict:
        return {"capability": fields_dict(self)}


def read_views(inp: SectionInput) -> Capability:
    """Every view's samples (the main samples where a view has the comparison's own settings)
    and the capability table."""
    cfg, found = inp.cfg, []
    for label, temperature, folder, view in view_folders(cfg, inp.out):
        if view.task == cfg.task and view.sampling == cfg.sampling:
            found.append({"data": label, "temperature": temperature, "sets": list(inp.sets)})
            continue
        inp.echo(f"[compare] {label}, {view_label(temperature)}")
        found.append({"data": label, "temperature": temperature, "sets": align([
            load_samples(src.name, sample_model(src.name, src.path, view, folder / src.name,
                                                inp.progress))
            for src in inp.sources])})
    return Capability(**capability(found, cfg.reference, inp.rng(), cfg.bootstrap))


def figure(cap: dict, path: Path) -> str:
    """One panel per problem set: each method's greedy accuracy beside its sampled pass@1 at
    every temperature (seed means), so a gain in the sampled bars that the greedy bar does not
    share reads as sharpening."""
    plt = pyplot()
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
    return save_figure(fig, path)


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """Greedy beside sampled, per problem set: is a gain new problems solved, or sampling
    mass moved onto the answers the model already gave greedily?"""
    cap = comp["capability"]
    out: list = [Heading(2, "Capability or sharpening"), Paragraph(
        "Every model read greedily (one sample at T = 0) and sampled at each temperature "
        "(pass@1 and pass@n of the same n samples). The sharpening gap is greedy accuracy "
        "minus sampled pass@1 at that temperature: training that only sharpens the "
        "distribution closes it without raising greedy accuracy, while new capability "
        "raises greedy accuracy and the problems newly solved greedily. Newly solved / lost "
        f"count the problems {cap['reference']} gets wrong / right greedily that the method "
        "gets right / wrong (seed means).")]
    temps = cap["temperatures"]
    header = ["method", "greedy"]
    for t in temps:
        header += [f"pass@1 {t}", f"pass@n {t}", f"entropy {t}", f"gap {t}"]
    header += [f"greedy - {cap['reference']} [95% CI]", "newly solved / lost"]
    for entry in cap["sets"]:
        rows = []
        for method, m in entry["methods"].items():
            row = [method, pct(m["greedy"])]
            for t in temps:
                sm = m["sampled"].get(t)
                row += ["-"] * 4 if sm is None else [
                    pct(sm["pass@1"]), pct(sm["pass@n"]), number(sm["entropy"]),
                    signed_points(m["gap"].get(t))]
            vs = entry["vs_reference"].get(method)
            row += ["-", "-"] if vs is None else [
                difference(vs["greedy"]["diff"], vs["greedy"]["ci95"], in_points) + " pts",
                f"{count(vs['newly_solved'])} / {count(vs['lost'])}"]
            rows.append(row)
        ns = sorted({sm["n"] for m in entry["methods"].values() for sm in m["sampled"].values()})
        out.append(Paragraph(f"**{entry['data']}**: {entry['num_problems']} problems, n = "
                             f"{', '.join(map(str, ns))} samples per problem in the sampled "
                             f"views."))
        out.append(Table(header, rows))
    out.append(Figure(figures["capability"], "Greedy accuracy beside sampled pass@1 at each "
                      "temperature, per problem set (seed means): a gain the greedy bar shares "
                      "is new problems solved, one only the sampled bars show is sharpening."))
    return out


SECTIONS.register("capability")(Section(
    place=20, enabled=lambda cfg: bool(views(cfg)), check=check_views, compute=read_views,
    figures=lambda comp, folder: {"capability": figure(comp["capability"],
                                                       folder / "capability.png")},
    blocks=blocks))
