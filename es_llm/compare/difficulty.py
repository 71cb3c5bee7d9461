"""Where on a difficulty scale each method gains: the "difficulty" section of a comparison.

Two difficulty signals per problem: the reference model's failure rate ``1 - c_i / n`` on the
compared samples (base difficulty), and the problem's tier (``difficulty`` field of the
problem file, e.g. the number of Countdown numbers), or a per-item column of a file the user
gives (``--difficulty-file``, e.g. human error rates). For every method (seed means of
per-problem accuracy ``c_i / n``):

- DRG against each signal (``es_llm.metrics.difficulty``; not against base difficulty for
  the reference itself, whose failures define it);
- accuracy per base-difficulty bin and per tier, and the paired difference to the reference
  with bootstrap intervals over the bin's problems;
- the share of the problems it solves in any of its n samples that the reference solved in
  fewer than 5% of its own (per training seed, then averaged).

A gain on base-hard bins is capability the reference lacked; a gain on base-easy bins only is
sharpening.

The comparison section ``difficulty`` (always on) is at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from es_llm.compare.samples import SampleSet
from es_llm.compare.sampling import compared_task
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, always,
                                    fields_dict)
from es_llm.errors import BadInput
from es_llm.io import jsonl_lines
from es_llm.metrics.difficulty import (DEFAULT_EDGES, accuracy_by_bin, bin_labels,
                                       difficulty_bins, drg, paired_difference_by_bin,
                                       rarely_solved_share)
from es_llm.report import (Figure, Heading, Paragraph, Table, colors, difference, in_points,
                           interval, pct, pyplot, save_figure, signed)
from populations.numbers import is_finite_number


def _accuracy_P(sets: list[SampleSet]) -> np.ndarray:
    """Seed-mean per-problem accuracy ``c_i / n``."""
    return np.mean([[float(np.mean(c)) for c in s.correct] for s in sets], axis=0)


def _rarely_solved(sets: list[SampleSet], ref_P: np.ndarray) -> float | None:
    """``rarely_solved_share`` of each seed's own samples (so a method with more seeds does
    not get more tries), averaged over the seeds that solve anything."""
    shares = [rarely_solved_share([bool(np.any(c)) for c in s.correct], ref_P) for s in sets]
    shares = [x for x in shares if x is not None]
    return float(np.mean(shares)) if shares else None


def _tiers(sets: list[SampleSet]) -> list | None:
    tiers = list(sets[0].difficulties)
    return tiers if all(t is not None for t in tiers) else None


def _by_group(groups_P: np.ndarray, labels: list, acc_P, ref_P, rng, num_resamples) -> list:
    rows = accuracy_by_bin(groups_P, acc_P, len(labels))
    diffs = paired_difference_by_bin(groups_P, acc_P, ref_P, len(labels), rng, num_resamples)
    return [{"label": str(label), "problems": r["problems"], "accuracy": r["accuracy"],
             "difference": d["difference"], "ci95": d["ci95"]}
            for label, r, d in zip(labels, rows, diffs)]


def difficulty(sets: list[SampleSet], reference: str, rng: np.random.Generator,
               num_resamples: int = 1000, item_difficulty: dict | None = None,
               edges=DEFAULT_EDGES) -> dict:
    """The difficulty section as a JSON-ready dict.

    Args:
        sets: aligned sample sets of every model (``samples.align``).
        reference: the method the others are measured against; its failure rate is the
            base difficulty.
        item_difficulty: ``{"name", "values": {problem id: difficulty}}`` from a file, or
            None; every compared problem must have a value (checked by the caller).
    Returns: ``{"reference", "edges", "bins", "signals", "methods": {method: {"drg":
        {signal: {value, auc, ci95} | None}, "rarely_solved_share", "by_bin": [...],
        "by_tier": [...] | None}}}``.
    """
    methods: dict[str, list[SampleSet]] = {}
    for s in sets:
        methods.setdefault(s.method, []).append(s)
    ref = reference.split("@")[0]
    ref_P = _accuracy_P(methods[ref])
    base_P = 1.0 - ref_P
    bins_P = difficulty_bins(base_P, edges)
    labels = bin_labels(edges)
    tiers = _tiers(sets)
    signals = {"base": base_P}
    if tiers is not None and all(is_finite_number(t) for t in tiers):
        signals["tier"] = np.asarray(tiers, dtype=np.float64)
    if item_difficulty is not None:
        signals[item_difficulty["name"]] = np.array(
            [float(item_difficulty["values"][pid]) for pid in sets[0].problem_ids])
    numeric = "tier" in signals
    tier_names = sorted(set(tiers), key=None if numeric else str) if tiers is not None else []
    tier_P = np.array([tier_names.index(t) for t in tiers]) if tiers is not None else None
    out = {}
    for method, mine in methods.items():
        acc_P = _accuracy_P(mine)
        out[method] = {
            "drg": {name: (None if name == "base" and method == ref else
                           drg(values, acc_P, rng, num_resamples))
                    for name, values in signals.items()},
            "rarely_solved_share": _rarely_solved(mine, ref_P),
            "by_bin": _by_group(bins_P, labels, acc_P, ref_P, rng, num_resamples),
            "by_tier": (_by_group(tier_P, tier_names, acc_P, ref_P, rng, num_resamples)
                        if tier_P is not None else None)}
    return {"reference": reference, "edges": list(edges), "bins": labels,
            "signals": list(signals), "methods": out}


# --- the section -------------------------------------------------------------------------------

def _compared_ids(inp: CheckInput) -> list[str]:
    """The problem ids the comparison will cover, known before anything is sampled."""
    if inp.loaded:
        return list(next(iter(inp.loaded.values())).problem_ids)
    task = compared_task(inp.cfg, inp.sources[0].path)
    try:
        return [p.id for p in task.problems()]
    finally:
        task.close()


def difficulty_file(inp: CheckInput) -> dict | None:
    """``{"name", "values": {problem id: float}}`` from ``cfg.difficulty_file``, or None;
    BadInput when the file is unreadable or misses a compared problem."""
    cfg = inp.cfg
    if cfg.difficulty_file is None:
        return None
    path, column = Path(cfg.difficulty_file), cfg.difficulty_column
    if not path.is_file():
        raise BadInput(f"--difficulty-file {str(path)!r} is not a file; give a JSONL file with "
                       f"an 'id' and a '{column}' number per problem.")
    values: dict[str, float] = {}
    for n, line, row in jsonl_lines(path, "--difficulty-file"):
        value = row.get(column) if isinstance(row, dict) else None
        if not isinstance(row, dict) or "id" not in row or not is_finite_number(value):
            raise BadInput(f"{path} line {n} needs an 'id' and a finite number in column "
                           f"'{column}' (difficulty_column=NAME picks the column), got "
                           f"{line[:120]!r}.")
        values[str(row["id"])] = float(value)
    missing = [pid for pid in _compared_ids(inp) if pid not in values]
    if missing:
        raise BadInput(f"{path} has no '{column}' for {len(missing)} of the compared problems "
                       f"(e.g. {missing[0]!r}); every problem needs a difficulty value.")
    return {"name": column, "values": values}


@dataclass(frozen=True)
class Difficulty:
    """comparison.json["difficulty"], ``difficulty``'s result."""

    reference: str
    edges: list
    bins: list[str]
    signals: list[str]
    methods: dict

    def to_json(self) -> dict:
        return {"difficulty": fields_dict(self)}


def compute(inp: SectionInput) -> Difficulty:
    """``inp.checked``: the difficulty file's values (``difficulty_file``), or None."""
    return Difficulty(**difficulty(list(inp.sets), inp.cfg.reference, inp.rng(),
                                   inp.cfg.bootstrap, inp.checked))


def figure(diff: dict, path: Path) -> str:
    """Accuracy per base-difficulty bin, one bar per method (seed means)."""
    plt = pyplot()
    methods = list(diff["methods"])
    labels = diff["bins"]
    x = np.arange(len(labels))
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(7, 4))
    color = colors(methods)
    for i, m in enumerate(methods):
        ys = [np.nan if g["accuracy"] is None else 100 * g["accuracy"]
              for g in diff["methods"][m]["by_bin"]]
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, ys, width, label=m, color=color[m])
    counts = [g["problems"] for g in diff["methods"][methods[0]]["by_bin"]]
    ax.set_xticks(x, [f"{lab}\n({c})" for lab, c in zip(labels, counts)])
    ax.set_xlabel(f"base difficulty: {diff['reference']}'s failure rate (problems)")
    ax.set_ylabel("accuracy per sample, %")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _drg_cell(d: dict | None) -> str:
    # Absent, or undefined (NaN in memory, null once written as JSON).
    if d is None or d["value"] is None or d["value"] != d["value"]:
        return "-"
    return interval(d["value"], d.get("ci95"), lambda x: signed(x, 3))


def _group_table(diff: dict, key: str, first: str) -> Table:
    """Rows: bins (or tiers); columns: each method's accuracy, and for the others the
    paired difference to the reference with its interval."""
    ref = diff["reference"].split("@")[0]
    methods = diff["methods"]
    others = [m for m in methods if m != ref]
    header = [first, "problems"] + [f"{m} accuracy" for m in methods] + [
        f"{m} - {ref} [95% CI]" for m in others]
    rows = []
    for i, g in enumerate(methods[ref][key]):
        row = [g["label"], str(g["problems"])]
        row += [pct(methods[m][key][i]["accuracy"]) for m in methods]
        for m in others:
            cell = methods[m][key][i]
            row.append("-" if cell["difference"] is None else
                       difference(cell["difference"], cell["ci95"], in_points) + " pts")
        rows.append(row)
    return Table(header, rows)


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """Where each method gains on a difficulty scale: DRG, accuracy per base-difficulty bin
    and per tier, against the reference."""
    diff = comp["difficulty"]
    ref = diff["reference"]
    out: list = [Heading(2, "Gains by difficulty"), Paragraph(
        f"Base difficulty is {ref}'s failure rate on each problem (1 - c/n of its samples). "
        "DRG = 2 AUC - 1, where AUC is the chance that, of a failed and a solved sample, the "
        "failed one is on the harder problem (+1: a method fails only where the problems are "
        "hardest, 0: unrelated); it does not depend on accuracy. A gain in the base-hard "
        "bins is capability the reference lacked; a gain in the easy bins only is "
        "sharpening. Rarely solved: of the problems a method solves in any sample, the share "
        f"{ref} solved in under 5% of its samples.")]
    signals = diff["signals"]
    out.append(Table(["method"] + [f"DRG vs {s} [95% CI]" for s in signals] + ["rarely solved"],
                     [[m] + [_drg_cell(v["drg"][s]) for s in signals]
                      + [pct(v["rarely_solved_share"])] for m, v in diff["methods"].items()]))
    out.append(_group_table(diff, "by_bin", "base difficulty"))
    if next(iter(diff["methods"].values()))["by_tier"] is not None:
        out.append(_group_table(diff, "by_tier", "tier"))
    out.append(Figure(figures["difficulty"], "Accuracy per base-difficulty bin (seed means of "
                      "per-problem accuracy), per method; the bins run from problems the "
                      "reference almost always solves to those it (almost) never does."))
    return out


SECTIONS.register("difficulty")(Section(
    place=30, enabled=always, check=difficulty_file, compute=compute, blocks=blocks,
    figures=lambda comp, folder: {"difficulty": figure(comp["difficulty"],
                                                       folder / "difficulty.png")}))
