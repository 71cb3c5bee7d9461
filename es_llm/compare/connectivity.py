"""Linear connectivity (``es-llm compare --connectivity``): accuracy along the straight line
between two models' weights.

For a pair A:B and each alpha of ``connectivity.alphas``, the weights theta(alpha) =
(1 - alpha) theta_A + alpha theta_B are written to a temporary model folder (A's config and
tokenizer beside them) and read like every other model of the comparison: greedily (one
sample at T = 0) and sampled with the comparison's settings (pass@1, the mean correctness of
the n samples; ``connectivity.n`` samples per problem where set). The barrier height is the
largest drop of the accuracy curve below the straight line between its endpoints' accuracies
(0 when the curve never dips below it), with a percentile bootstrap interval over problems.
arXiv 2604.01499 reports that ES and GRPO solutions on Qwen3-4B are linearly connected
without such a barrier.

The comparison section ``connectivity`` (enabled by ``connectivity.enabled`` or pairs) is at
the end.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from es_llm.compare.budget import read_correct
from es_llm.compare.config import CompareConfig
from es_llm.compare.geometry import check_same_weights, read_tensor, weight_files
from es_llm.compare.sampling import sample_model
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, fields_dict,
                                    model_folder)
from es_llm.errors import BadInput
from es_llm.evaluate import EvalConfig
from es_llm.metrics.bootstrap import percentile_interval
from es_llm.models import resolve_task_config
from es_llm.report import (Figure, Heading, Paragraph, Table, bracket, colors, pct, pyplot,
                           save_figure, signed_points)

# The label of the comparison's reference model in connectivity.pairs.
REFERENCE = "reference"


# --- the maths ---------------------------------------------------------------------------------

def interpolate(W_a_any: torch.Tensor, W_b_any: torch.Tensor, alpha: float) -> torch.Tensor:
    """(1 - alpha) W_a + alpha W_b in float32, stored back in W_a's dtype. ``torch.lerp``
    gives each endpoint's weights back exactly at alpha 0 and 1, so the ends of the curve
    are the endpoint models themselves."""
    return torch.lerp(W_a_any.float(), W_b_any.float(), alpha).to(W_a_any.dtype)


def barrier(accuracy_A_any: np.ndarray, alphas_A: np.ndarray) -> np.ndarray:
    """The largest drop of an accuracy curve below the straight line between its endpoints:
    ``max_alpha [(1 - alpha) acc(0) + alpha acc(1) - acc(alpha)]`` over the first axis
    (``alphas_A`` sorted, from 0 to 1; trailing axes, e.g. resamples, are kept). At least 0,
    since the line meets the curve at both endpoints."""
    acc = np.asarray(accuracy_A_any, dtype=np.float64)
    shape = (-1,) + (1,) * (acc.ndim - 1)
    a = np.asarray(alphas_A, dtype=np.float64).reshape(shape)
    line = (1 - a) * acc[:1] + a * acc[-1:]
    return np.max(line - acc, axis=0)


def barrier_with_ci(values_A_P: np.ndarray, alphas_A: np.ndarray, rng: np.random.Generator,
                    num_resamples: int) -> dict:
    """The barrier of the mean accuracy over problems (``values_A_P``: per alpha and problem)
    with its 95% percentile bootstrap interval, problems resampled jointly for every alpha."""
    lo, hi = percentile_interval(values_A_P, lambda x_A_R_P: barrier(x_A_R_P.mean(-1), alphas_A),
                                 rng, num_resamples, 0.95)
    return {"accuracy": values_A_P.mean(-1).tolist(),
            "barrier": float(barrier(values_A_P.mean(-1), alphas_A)),
            "ci95": [float(lo), float(hi)]}


# --- checking the pairs ------------------------------------------------------------------------

def pair_labels(cfg: CompareConfig, names: list[str]) -> list[tuple[str, str]]:
    """(A, B) model names of every pair, ``reference`` read as the reference's name; the
    default is the reference to every other model. BadInput for an unknown label."""
    entries = cfg.connectivity.pairs or [f"{REFERENCE}:{n}" for n in names
                                         if n != cfg.reference]
    out = []
    for entry in entries:
        pair = tuple(cfg.reference if label == REFERENCE else label
                     for label in entry.split(":"))
        unknown = [label for label in pair if label not in names]
        if unknown:
            raise BadInput(f"connectivity pair {entry!r} names {', '.join(map(repr, unknown))}, "
                           f"which is no model of the comparison; labels are the model names "
                           f"({', '.join(names)}) or {REFERENCE!r} (the --reference model, "
                           f"here {cfg.reference!r}).")
        out.append(pair)
    return out


def check(inp: CheckInput) -> list[dict]:
    """Every pair's two model folders, checked to share architecture and tensor shapes, and
    the problem file both are read on (A's resolved data), before anything is sampled."""
    needs = "--connectivity interpolates"
    sources = {src.name: src for src in inp.sources}
    labels = pair_labels(inp.cfg, list(sources))
    if not labels:
        raise BadInput(f"--connectivity has no pair: give --connectivity-pairs A:B, or a model "
                       f"besides the reference {inp.cfg.reference!r}.")
    pairs = []
    for a, b in labels:
        folders = {a: model_folder(inp, sources[a], needs),
                   b: model_folder(inp, sources[b], needs)}
        check_same_weights(folders, f"connectivity pair {a}:{b}")
        data = resolve_task_config(EvalConfig(model=str(folders[a]), task=inp.cfg.task)).task.data
        pairs.append({"a": a, "b": b, "folder_a": folders[a], "folder_b": folders[b],
                      "data": data})
    return pairs


# --- the section -------------------------------------------------------------------------------

def write_interpolated(folder_a: Path, folder_b: Path, alpha: float, dest: Path) -> Path:
    """A model folder at ``dest`` holding theta(alpha) in A's files (same shards and dtypes)
    beside A's other top-level files (config, tokenizer, shard index)."""
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    for path in folder_a.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, dest / path.name)
    files_a, files_b = weight_files(folder_a), weight_files(folder_b)
    for shard in sorted(set(files_a.values())):
        tensors = {name: interpolate(read_tensor(files_a, name), read_tensor(files_b, name),
                                     alpha)
                   for name, path in files_a.items() if path == shard}
        save_file(tensors, str(dest / shard.name), metadata={"format": "pt"})
    return dest


def samples_per_problem(cfg: CompareConfig) -> int:
    """The sampled curve's n: ``connectivity.n``, or the comparison's ``--n`` when unset."""
    return cfg.connectivity.n or cfg.sampling.n


def read_pair(inp: SectionInput, pair: dict) -> dict:
    """Greedy and sampled reads of theta(alpha) for every alpha of one pair (samples under
    OUT/samples/connectivity/A_to_B/), and both curves' barriers."""
    cfg = inp.cfg
    alphas_A = np.array(sorted(set(cfg.connectivity.alphas)), dtype=float)
    task = replace(cfg.task, data=pair["data"])
    views = {"greedy": replace(cfg, task=task,
                               sampling=replace(cfg.sampling, n=1, temperature=0.0)),
             "pass@1": replace(cfg, task=task,
                               sampling=replace(cfg.sampling, n=samples_per_problem(cfg)))}
    values: dict[str, list[np.ndarray]] = {key: [] for key in views}
    for alpha in alphas_A:
        inp.echo(f"[compare] connectivity {pair['a']} -> {pair['b']}: alpha {alpha:g}")
        point = (inp.out / "samples" / "connectivity" / f"{pair['a']}_to_{pair['b']}"
                 / f"alpha_{alpha:g}")
        # theta(alpha) is written to the same folder on every run of the comparison, so a
        # rerun reuses the point's samples (they record the model's path); it sits beside
        # the output, on the disk chosen for large files, and is removed once read.
        model = write_interpolated(pair["folder_a"], pair["folder_b"], float(alpha),
                                   point / "model")
        try:
            for key, view in views.items():
                correct = read_correct(sample_model(f"{pair['a']}:{pair['b']} at {alpha:g}",
                                                    model, view, point / key.replace("@", ""),
                                                    inp.progress) / "samples.jsonl")
                values[key].append(np.array([np.mean(correct[i]) for i in sorted(correct)]))
        finally:
            shutil.rmtree(model, ignore_errors=True)
    rng = inp.rng()
    return {"a": pair["a"], "b": pair["b"], "data": pair["data"],
            "num_problems": len(values["greedy"][0]),
            **{key: barrier_with_ci(np.stack(v), alphas_A, rng, cfg.bootstrap)
               for key, v in values.items()}}


@dataclass(frozen=True)
class Connectivity:
    """comparison.json["connectivity"]: the alphas and, per pair, both accuracy curves with
    their barriers (``barrier_with_ci``)."""

    alphas: list[float]
    n: int
    temperature: float
    pairs: list[dict]

    def to_json(self) -> dict:
        return {"connectivity": fields_dict(self)}


def compute(inp: SectionInput) -> Connectivity:
    """``inp.checked``: the pairs (``check``)."""
    cfg = inp.cfg
    return Connectivity(sorted(set(cfg.connectivity.alphas)),
                        samples_per_problem(cfg), cfg.sampling.temperature,
                        [read_pair(inp, p) for p in inp.checked])


def figure(con: dict, path: Path) -> str:
    """Greedy accuracy (left) and sampled pass@1 (right) against alpha, one line per pair,
    each with the dotted straight line between its endpoints."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{p['a']} -> {p['b']}" for p in con["pairs"]]
    color = colors(labels)
    for ax, key in zip(axes, ("greedy", "pass@1")):
        for label, p in zip(labels, con["pairs"]):
            acc = p[key]["accuracy"]
            ax.plot(con["alphas"], acc, marker="o", color=color[label], label=label)
            ax.plot([0, 1], [acc[0], acc[-1]], ls=":", color=color[label])
        ax.set_xlabel("alpha (0 = first model, 1 = second)")
        ax.set_ylabel("greedy accuracy" if key == "greedy" else "sampled pass@1")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """Linear connectivity: accuracy along each pair's straight line and its barrier."""
    con = comp["connectivity"]
    alphas = con["alphas"]
    rows = [[f"{p['a']} -> {p['b']}", key] + [pct(v) for v in p[key]["accuracy"]]
            + [signed_points(p[key]["barrier"]), bracket(p[key]["ci95"], signed_points)]
            for p in con["pairs"] for key in ("greedy", "pass@1")]
    return [Heading(2, "Linear connectivity"), Paragraph(
        f"Each pair's weights mixed as (1 - alpha) first + alpha second and read on "
        f"{con['pairs'][0]['num_problems']} problems: greedily, and sampled n = {con['n']} "
        f"times at T = {con['temperature']:g} (pass@1). The barrier is the largest drop of "
        f"the accuracy below the straight line between the two endpoints (0 when it never "
        f"dips), with its 95% bootstrap interval over problems; an interval whose lower end "
        f"is 0 is consistent with no barrier."),
        Table(["pair", "read"] + [f"alpha {a:g}" for a in alphas] + ["barrier", "95% CI"],
              rows),
        Figure(figures["connectivity"], "Accuracy along the straight line between each "
               "pair's weights (dotted: the line between the endpoints' accuracies).")]


SECTIONS.register("connectivity")(Section(
    place=140, enabled=lambda cfg: cfg.connectivity.enabled or bool(cfg.connectivity.pairs),
    check=check, compute=compute, blocks=blocks,
    figures=lambda comp, folder: {"connectivity": figure(comp["connectivity"],
                                                         folder / "connectivity.png")}))
