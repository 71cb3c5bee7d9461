"""The sections about where the compared models came from: the generated samples each
training run spent, the runs' training curves, and the models with the machines they were
trained and sampled on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from es_llm.compare.section import SECTIONS, Section, SectionInput, always
from es_llm.io import complete_jsonl_rows
from es_llm.machine import machine_kind
from es_llm.report import Figure, Heading, Paragraph, Table, colors, pyplot, save_figure
from es_llm.run_folder import recorded_machine


def training_curve(run: Path) -> dict | None:
    """Reward against generated samples from a run's metrics.jsonl (ES or gradient)."""
    rows = complete_jsonl_rows(run / "metrics.jsonl")
    if not rows:
        return None
    metric = "es/reward_mean" if "es/reward_mean" in rows[0] else "reward/mean"
    rows = [r for r in rows if metric in r and "samples/generated" in r]
    if not rows:
        return None
    return {"metric": metric, "samples": [r["samples/generated"] for r in rows],
            "reward": [r[metric] for r in rows]}


def training_curves(inp: SectionInput) -> dict[str, dict]:
    """The training curve of every compared model whose run is known and has one."""
    curves = {s.name: training_curve(Path(s.run)) for s in inp.sets if s.run}
    return {name: c for name, c in curves.items() if c}


# --- generated samples per training run --------------------------------------------------------

@dataclass(frozen=True)
class TrainingSamples:
    """comparison.json["training_samples"]: per method, the generated samples of each of its
    runs (the last point of its training curve), the budget the methods were matched on."""

    by_method: dict[str, list[float]]

    def to_json(self) -> dict:
        return {"training_samples": self.by_method}


def samples_per_run(inp: SectionInput) -> TrainingSamples:
    by_method: dict[str, list[float]] = {}
    for name, c in training_curves(inp).items():
        by_method.setdefault(name.split("@")[0], []).append(c["samples"][-1])
    return TrainingSamples(by_method)


def samples_blocks(comp: dict, figures: dict[str, str]) -> list:
    runs = comp["training_samples"]
    if not runs:
        return []
    return [Heading(2, "Training budget"),
            Table(["method", "generated samples per run", "runs"],
                  [[m, ", ".join(f"{int(v):,}" for v in sorted(set(vals))), str(len(vals))]
                   for m, vals in runs.items()])]


SECTIONS.register("training_samples")(Section(place=60, enabled=always, compute=samples_per_run,
                                              blocks=samples_blocks))


# --- training curves ---------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainingCurves:
    """comparison.json["training"]: per model, its run's training reward against generated
    samples (``training_curve``)."""

    by_model: dict[str, dict]

    def to_json(self) -> dict:
        return {"training": self.by_model}


def training_figure(comp: dict, path: Path) -> str | None:
    """Training reward against generated samples for every run that has a curve."""
    curves = comp["training"]
    if not curves:
        return None
    plt = pyplot()
    color = colors(list(comp["methods"]))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    seen = set()
    for name, c in curves.items():
        method = name.split("@")[0]
        line = color.get(method, "black")
        ax.plot(c["samples"], c["reward"], color=line, lw=0.6, alpha=0.35)
        # A trailing mean over a tenth of the run shows the trend under per-step noise.
        window = max(1, len(c["reward"]) // 10)
        smooth = np.convolve(c["reward"], np.ones(window) / window, mode="valid")
        ax.plot(c["samples"][window - 1:], smooth, color=line, lw=1.6,
                label=f"{method}: {c['metric']} (trailing mean of {window})"
                if method not in seen else None)
        seen.add(method)
    ax.set_xlabel("generated samples")
    ax.set_ylabel("training reward")
    ax.set_title("training curves (one line per training seed; faint: every step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def training_figures(comp: dict, folder: Path) -> dict[str, str]:
    name = training_figure(comp, folder / "training.png")
    return {"training": name} if name else {}


def training_blocks(comp: dict, figures: dict[str, str]) -> list:
    if "training" not in figures:
        return []
    return [Heading(2, "Training curves"),
            Figure(figures["training"], "Training reward against generated samples. ES scores "
                   "its population greedily; the gradient methods' rollouts are sampled, so the "
                   "levels are not comparable, the trends are.")]


SECTIONS.register("training")(Section(
    place=110, enabled=always, blocks=training_blocks, figures=training_figures,
    compute=lambda inp: TrainingCurves(training_curves(inp))))


# --- models and machines -----------------------------------------------------------------------

@dataclass(frozen=True)
class Machines:
    """comparison.json["machines"]: per model, the machine kind (``machine_kind``) it was
    trained or built on and the one its samples were drawn on, where recorded."""

    by_model: dict[str, dict]

    def to_json(self) -> dict:
        return {"machines": self.by_model}


def machines(inp: SectionInput) -> Machines:
    out = {}
    for s in inp.sets:
        model = s.run or s.model
        trained = None
        if model:
            folder = Path(model)
            trained = recorded_machine(folder) or recorded_machine(folder.parent.parent)
        out[s.name] = {"trained": machine_kind(trained) if trained else None,
                       "sampled": machine_kind(s.machine) if s.machine else None}
    return Machines(out)


def machines_note(where: dict) -> str | None:
    """A warning when the compared models were trained or sampled on different kinds of
    machine, else None."""
    kinds = sorted({k for m in where.values() for k in m.values() if k})
    if len(kinds) < 2:
        return None
    return ("**Different machines.** These results come from " + "; ".join(kinds) + ". "
            "Builds and runs are bitwise reproducible only on one machine type: the same "
            "testbed config built on another CPU type gives other weights, so a difference "
            "between models made on different machines mixes the methods' effect with the "
            "machines'; it is reproducible only statistically.")


def models_blocks(comp: dict, figures: dict[str, str]) -> list:
    where = comp["machines"]
    out: list = [Heading(2, "Models"), Table(
        ["model", "samples", "training run", "trained or built on", "sampled on"],
        [[name, m["source"], m["run"] or "-", where[name]["trained"] or "-",
          where[name]["sampled"] or "-"] for name, m in comp["models"].items()])]
    note = machines_note(where)
    return out + [Paragraph(note)] if note else out


SECTIONS.register("models")(Section(place=120, enabled=always, compute=machines,
                                    blocks=models_blocks))
