"""Off-task drift (``es-llm compare --drift``): what training on one task cost every model on
tasks it was not trained on, against the comparison's reference (their common base).

Per off-task problem file (``drift.tasks``; by default the reference model's held-out
arithmetic set, ``data/arithmetic_eval.jsonl`` of a testbed model) every model is read
greedily (one sample at T = 0) like every other read of the comparison, and its accuracy is
set against the reference's by the paired difference over problems with its 95% percentile
bootstrap interval (``analysis.paired``). On the first ``drift.kl_prompts`` problems of each
file, each model's own greedy completion is teacher-forced through the model and through the
reference, and the per-token KL(model || reference) of their next-token distributions is
averaged over the completion's tokens, then over the prompts (``token_kl``): a drift the
accuracy alone may not show; its 95% percentile bootstrap interval is over those prompts.

Where ``--budget-runs`` names training runs, every checkpoint along them (``budget``'s
``budget_points``) is read the same way, at the same settings, so the drift is seen against
the generated training samples and the training seconds that bought it.

arXiv 2601.20861 and 2605.30148 report that ES drifts off-task: a held-out capability keeps
dropping after about 200 ES iterations while GRPO's holds, and anchored weight decay toward
the start (``es.anchor_decay``) fixes it.

Models run with transformers on the CPU in float32, the reference and one other model at a
time. The comparison section ``drift`` (enabled by ``drift.enabled``) is at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from es_llm.compare.analysis import paired, shared_resamples
from es_llm.compare.budget import parse_runs
from es_llm.compare.config import CompareConfig
from es_llm.compare.geometry import check_same_vocabulary, check_same_weights, reference_folder
from es_llm.compare.sampling import sample_model
from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, fields_dict,
                                    model_folder)
from es_llm.errors import BadInput
from es_llm.io import read_jsonl
from es_llm.metrics.bootstrap import percentile_interval
from es_llm.report import (Figure, Heading, Paragraph, Table, colors, difference, in_points,
                           interval, number, pct, pyplot, save_figure)
from es_llm.tasks import TaskConfig, build_task

# The reference model's own off-task set when drift.tasks names none: a testbed model's
# held-out arithmetic problems, which no Countdown training run reads.
DEFAULT_TASK, DEFAULT_FILE = "arithmetic", Path("data") / "arithmetic_eval.jsonl"


# --- the maths ---------------------------------------------------------------------------------

def token_kl(logp_trained_B_T_V: torch.Tensor, logp_base_B_T_V: torch.Tensor,
             mask_B_T: torch.Tensor) -> torch.Tensor:
    """``kl_B``: per row, the mean over its counted positions of KL(trained || base) between
    the two next-token distributions, sum_v p_trained(v) (log p_trained(v) - log p_base(v)).

    Args:
        logp_trained_B_T_V, logp_base_B_T_V: log-probabilities (log-softmax over the V
            tokens) at each of T positions of B rows.
        mask_B_T: true (or 1) where a position counts, e.g. the completion's tokens.
    Returns: float tensor of B; NaN for a row with no counted position."""
    p_B_T_V = logp_trained_B_T_V.exp()
    # A token the trained model gives probability 0 adds nothing (0 log 0 = 0), even where a
    # log-probability is -inf and the product would be NaN.
    kl_B_T = torch.where(p_B_T_V > 0, p_B_T_V * (logp_trained_B_T_V - logp_base_B_T_V),
                         0.0).sum(-1)
    mask = mask_B_T.bool()
    # Padding positions may hold anything, NaN included: they are dropped, not multiplied by 0.
    return torch.where(mask, kl_B_T, 0.0).sum(-1) / mask.sum(-1)


def accuracy_changes(correct: dict[str, np.ndarray], reference: str, rng: np.random.Generator,
                     num_resamples: int) -> dict[str, dict]:
    """Per model of ``correct`` (name -> per-problem correctness, problems aligned), its mean
    accuracy against the reference's by ``analysis.paired`` (the difference with its 95%
    bootstrap interval over problems), every model on the same resamples."""
    resamples = shared_resamples(len(correct[reference]), rng, num_resamples)
    return {name: paired(c_P, correct[reference], resamples) for name, c_P in correct.items()}


def mean_kl(kl_per_prompt: list, rng: np.random.Generator, num_resamples: int) -> dict:
    """``{"kl", "kl_ci95"}``: the mean of the per-prompt KLs (None, an empty completion, left
    out) and its 95% percentile bootstrap interval over those prompts
    (``metrics.bootstrap.percentile_interval``); None for both where no prompt counts."""
    counted_P = np.array([k for k in kl_per_prompt if k is not None], dtype=float)
    if not counted_P.size:
        return {"kl": None, "kl_ci95": None}
    lo, hi = percentile_interval(counted_P, lambda x_R_P: x_R_P.mean(axis=-1), rng,
                                 num_resamples, 0.95)
    return {"kl": float(counted_P.mean()), "kl_ci95": [float(lo), float(hi)]}


# --- models ------------------------------------------------------------------------------------

def load_model(folder: Path):
    """A model folder's causal LM on the CPU in float32, for scoring."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def completion_logprobs(model, prompt_ids: list[int],
                        completion_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp_1_T_V, mask_1_T)``: the model's next-token log-probabilities at every position
    of prompt + completion but the last, and the positions that predict a completion token."""
    ids_1_L = torch.tensor([prompt_ids + completion_ids], dtype=torch.long)
    logp_1_T_V = torch.log_softmax(model(input_ids=ids_1_L).logits.float(), -1)[:, :-1]
    # The logits at position t predict token t + 1, so the completion's tokens are predicted
    # from the prompt's last position on.
    mask_1_T = (torch.arange(ids_1_L.shape[1] - 1) >= len(prompt_ids) - 1)[None]
    return logp_1_T_V, mask_1_T


@torch.no_grad()
def model_kl(trained, base, tokenizer, prompts: list[str], completions: list[str]) -> list:
    """Per prompt, the mean per-token KL(trained || base) over the tokens of its completion
    (teacher-forced after the prompt, tokenised as the scorers of es-llm testtime do); None
    for an empty completion, which has no token to compare on."""
    out = []
    for prompt, completion in zip(prompts, completions):
        prompt_ids = tokenizer(prompt).input_ids
        completion_ids = tokenizer(completion, add_special_tokens=False).input_ids
        if not completion_ids:
            out.append(None)
            continue
        logp_t, mask = completion_logprobs(trained, prompt_ids, completion_ids)
        logp_b, _ = completion_logprobs(base, prompt_ids, completion_ids)
        out.append(float(token_kl(logp_t, logp_b, mask)[0]))
    return out


# --- checking the input ------------------------------------------------------------------------

def drift_tasks(cfg: CompareConfig, ref: Path) -> list[dict]:
    """Each off-task set as ``{"label", "task": TaskConfig}``, its file checked to hold
    problems; BadInput for a missing or empty file, or no set at all."""
    entries = cfg.drift.tasks or ([f"{DEFAULT_TASK}={ref / DEFAULT_FILE}"]
                                  if (ref / DEFAULT_FILE).is_file() else [])
    if not entries:
        raise BadInput(f"--drift reads the models on problem sets they were not trained on, but "
                       f"none is given and the reference {cfg.reference!r} has no "
                       f"{DEFAULT_FILE} ({ref}); give drift.tasks as FILE or TASK=FILE (e.g. "
                       f"--drift-tasks arithmetic=base/data/arithmetic_eval.jsonl).")
    found, labels = [], set()
    for entry in entries:
        name, data = entry.split("=", 1) if "=" in entry else (cfg.task.name, entry)
        if not Path(data).is_file():
            raise BadInput(f"drift task file {data!r} does not exist; give drift.tasks as FILE "
                           f"(read as task {cfg.task.name!r}) or TASK=FILE, e.g. "
                           f"arithmetic=base/data/arithmetic_eval.jsonl.")
        # The comparison's task settings (limit, answer tags, chat template) on this file.
        task = replace(cfg.task, name=name, data=data, select=None)
        if _num_problems(task) == 0:
            raise BadInput(f"drift task file {data!r} holds no problems of task {name!r}.")
        stem = Path(data).stem
        label = stem if stem not in labels else f"{stem}-{len(labels)}"
        labels.add(label)
        found.append({"label": label, "task": task})
    return found


def _num_problems(task: TaskConfig) -> int:
    built = build_task(task)
    try:
        return len(built.problems())
    finally:
        built.close()


def _output_width(folder: Path) -> int | None:
    """A model folder's config.json vocab_size (None where it records none)."""
    return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("vocab_size")


def check_comparable(reference: str, ref: Path, trained: dict[str, Path], needs: str) -> None:
    """BadInput naming the first model of ``trained`` (name -> folder) whose tokenizer
    vocabulary or output layer differs from the reference's (``ref``): the KL compares their
    next-token distributions token by token; ``needs`` opens the paragraph."""
    check_same_vocabulary(reference, ref, trained, needs)
    # One tokenizer may sit on output layers of other widths (a padded vocabulary), whose
    # next-token distributions cannot be compared entry by entry.
    width = _output_width(ref)
    for name, folder in trained.items():
        if _output_width(folder) != width:
            raise BadInput(f"{needs}, but {name}'s output layer has {_output_width(folder)} "
                           f"tokens and the reference {reference!r} has {width} "
                           f"(config.json vocab_size); give models of one vocabulary.")


def run_checkpoints(cfg: CompareConfig) -> tuple[list[dict], dict[str, Path]]:
    """The budget runs of ``--budget-runs`` (``budget.parse_runs``) as ``[{"label", "method",
    "points"}]``, and every checkpoint's folder under its name LABEL/step_K; none without."""
    runs = [{"label": label, "method": method, "points": points}
            for method, seeds in parse_runs(cfg.budget.runs).items() for label, points in seeds]
    return runs, {f"{run['label']}/step_{p['steps']}": Path(p["checkpoint"])
                  for run in runs for p in run["points"]}


def check(inp: CheckInput) -> dict:
    """The reference's and every other model's folder (one tokenizer vocabulary, which the KL
    compares token by token), the checkpoints along the budget runs (the reference's
    architecture and tensor shapes too: it is their start) and the off-task sets, before
    anything is sampled."""
    needs = "--drift reads every model and its KL to the reference"
    ref = reference_folder(inp, needs)
    trained = {src.name: model_folder(inp, src, needs) for src in inp.sources
               if src.name != inp.cfg.reference}
    check_comparable(inp.cfg.reference, ref, trained, needs)
    runs, checkpoints = run_checkpoints(inp.cfg)
    if checkpoints:
        check_same_weights({inp.cfg.reference: ref, **checkpoints},
                           f"--drift reads the checkpoints of --budget-runs against the "
                           f"reference {inp.cfg.reference!r}, their common base")
        check_comparable(inp.cfg.reference, ref, checkpoints,
                         "--drift reads the checkpoints of --budget-runs and their KL to the "
                         "reference")
    return {"folders": {inp.cfg.reference: ref, **trained}, "runs": runs,
            "checkpoints": checkpoints, "tasks": drift_tasks(inp.cfg, ref)}


# --- the section -------------------------------------------------------------------------------

def greedy_rows(inp: SectionInput, name: str, folder: Path, entry: dict) -> dict[str, dict]:
    """Problem id -> the one greedy sample row of model ``name`` on an off-task set, read into
    OUT/samples/drift/LABEL/NAME (or reused from an identical earlier run)."""
    view = replace(inp.cfg, task=entry["task"],
                   sampling=replace(inp.cfg.sampling, n=1, temperature=0.0))
    out = sample_model(f"{name} on {entry['label']}", folder, view,
                       inp.out / "samples" / "drift" / entry["label"] / name, inp.progress)
    return {row["problem_id"]: row for row in read_jsonl(out / "samples.jsonl")}


def greedy_reads(inp: SectionInput, entry: dict, folders: dict[str, Path]) -> dict:
    """One off-task set read greedily by every model of ``folders`` (name -> folder, the
    reference among them): its rows by model and problem id, and the problem ids in the
    reference's order."""
    inp.echo(f"[compare] drift on {entry['label']}")
    rows = {name: greedy_rows(inp, name, folder, entry) for name, folder in folders.items()}
    return {"entry": entry, "rows": rows, "ids": list(rows[inp.cfg.reference])}


def kl_per_model(inp: SectionInput, reads: list[dict],
                 folders: dict[str, Path]) -> dict[str, list[list]]:
    """Per model of ``folders`` but the reference and per off-task read (``greedy_reads``),
    ``model_kl`` on the model's own greedy completions of the read's first
    ``drift.kl_prompts`` problems; the reference and one other model are in memory at once,
    each loaded once."""
    from transformers import AutoTokenizer

    reference = inp.cfg.reference
    base = load_model(folders[reference])
    tokenizer = AutoTokenizer.from_pretrained(folders[reference])
    out = {}
    for name, folder in folders.items():
        if name == reference:
            continue
        inp.echo(f"[compare] drift: KL of {name} to {reference}")
        trained = load_model(folder)
        out[name] = []
        for read in reads:
            mine = [read["rows"][name][i] for i in read["ids"][:inp.cfg.drift.kl_prompts]]
            out[name].append(model_kl(trained, base, tokenizer, [r["prompt"] for r in mine],
                                      [r["completion"] for r in mine]))
        del trained
    return out


def task_result(inp: SectionInput, read: dict, kls: dict[str, list]) -> dict:
    """One off-task set's entry of comparison.json: every model's greedy accuracy, its
    paired change against the reference and its mean KL to the reference with its interval
    over prompts (``kls``: per model but the reference, the KL per prompt)."""
    cfg, entry, ids = inp.cfg, read["entry"], read["ids"]
    correct = {name: np.array([bool(r[i]["correct"]) for i in ids], dtype=float)
               for name, r in read["rows"].items()}
    changes = accuracy_changes(correct, cfg.reference, inp.rng(), cfg.bootstrap)
    num_kl = min(len(ids), cfg.drift.kl_prompts)
    models, rng = {}, inp.rng()
    for name in read["rows"]:
        per_prompt = kls.get(name, [0.0] * num_kl)  # the reference against itself
        models[name] = {"accuracy": changes[name]["a"], "change": changes[name],
                        **mean_kl(per_prompt, rng.spawn(1)[0], cfg.bootstrap),
                        "kl_per_prompt": per_prompt}
    return {"label": entry["label"], "task": entry["task"].name, "data": entry["task"].data,
            "num_problems": len(ids), "kl_prompts": num_kl, "models": models}


def along_runs(runs: list[dict], tasks: list[dict]) -> list[dict]:
    """The budget runs (``run_checkpoints``) with every checkpoint's off-task results, taken
    out of ``tasks`` (``task_result``s, where it is the model LABEL/step_K): per checkpoint
    its place (steps, samples, seconds) and per off-task set its greedy accuracy, its change
    against the reference and its KL to the reference."""
    return [{**run, "points": [
        {**p, "tasks": {t["label"]: t["models"][f"{run['label']}/step_{p['steps']}"]
                        for t in tasks}} for p in run["points"]]} for run in runs]


@dataclass(frozen=True)
class Drift:
    """comparison.json["drift"]: the reference and, per off-task set, every model's greedy
    accuracy, its change against the reference (``analysis.paired``) and its mean KL; per
    budget run (``runs``, empty without ``--budget-runs``) the same for every checkpoint."""

    reference: str
    tasks: list[dict]
    runs: list[dict]

    def to_json(self) -> dict:
        return {"drift": fields_dict(self)}


def compute(inp: SectionInput) -> Drift:
    """``inp.checked``: the model folders, budget-run checkpoints and off-task sets
    (``check``). Every set is read by every model and checkpoint first, so that each is loaded
    for the KL once; the checkpoints are resampled with the models (``shared_resamples``
    does not depend on how many models share them), so the models' numbers are the same
    with or without the runs."""
    checked = inp.checked
    folders = {**checked["folders"], **checked["checkpoints"]}
    reads = [greedy_reads(inp, e, folders) for e in checked["tasks"]]
    kls = kl_per_model(inp, reads, folders)
    tasks = [task_result(inp, read, {n: k[j] for n, k in kls.items()})
             for j, read in enumerate(reads)]
    runs = along_runs(checked["runs"], tasks)
    for t in tasks:
        t["models"] = {n: m for n, m in t["models"].items() if n in checked["folders"]}
    return Drift(inp.cfg.reference, tasks, runs)


def figure(drift: dict, path: Path) -> str:
    """One panel per off-task set: each model's greedy accuracy change against the reference,
    with its 95% interval."""
    plt = pyplot()
    tasks = drift["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        names = [n for n in t["models"] if n != drift["reference"]]
        changes = [t["models"][n]["change"] for n in names]
        diff = np.array([100 * c["diff"] for c in changes])
        err = np.array([[100 * (c["diff"] - c["ci95"][0]), 100 * (c["ci95"][1] - c["diff"])]
                        for c in changes]).reshape(-1, 2).T
        ax.bar(range(len(names)), diff, yerr=err, capsize=4)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=30)
        ax.set_ylabel(f"greedy accuracy - {drift['reference']} (points)")
        ax.set_title(f"{t['label']} ({t['num_problems']} problems)")
        ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


def budget_figure(drift: dict, path: Path) -> str:
    """Drift against budget: per off-task set (columns), each checkpoint's greedy accuracy
    change against the reference (top) and its KL to the reference (bottom) against the
    run's generated training samples, one line per run from the reference at 0 samples, each
    point with its 95% interval."""
    plt = pyplot()
    runs, labels = drift["runs"], [t["label"] for t in drift["tasks"]]
    fig, axes = plt.subplots(2, len(labels), figsize=(5 * len(labels), 7), squeeze=False)
    color = colors([run["label"] for run in runs])
    for j, label in enumerate(labels):
        for run in runs:
            xs = [0.0] + [p["samples"] for p in run["points"]]
            at = [p["tasks"][label] for p in run["points"]]
            for ax, stat, ci in ((axes[0][j], [100 * m["change"]["diff"] for m in at],
                                  [[100 * c for c in m["change"]["ci95"]] for m in at]),
                                 (axes[1][j], [m["kl"] for m in at],
                                  [m["kl_ci95"] for m in at])):
                ys = [0.0] + [np.nan if v is None else v for v in stat]
                lo_hi = np.array([[0.0, 0.0]] + [[np.nan, np.nan] if c is None else c
                                                 for c in ci]).T
                err = np.abs(lo_hi - np.array(ys))
                ax.errorbar(xs, ys, yerr=err, color=color[run["label"]], marker="o",
                            capsize=3, label=run["label"])
        axes[0][j].set_title(label)
        axes[0][j].set_ylabel(f"greedy accuracy - {drift['reference']} (points)")
        axes[1][j].set_ylabel(f"KL to {drift['reference']} (per token)")
        for ax in axes[:, j]:
            ax.axhline(0, color="black", lw=0.8, ls=":")
            ax.set_xlabel("generated training samples")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, path)


def budget_rows(drift: dict) -> list[list[str]]:
    """The drift-against-budget table's rows: per run, checkpoint and off-task set, its place
    and its greedy accuracy, change and KL to the reference with their intervals."""
    rows = []
    for run in drift["runs"]:
        for p in run["points"]:
            for label, m in p["tasks"].items():
                rows.append([run["label"], str(p["steps"]), f"{p['samples']:,.0f}",
                             f"{p['seconds']:,.0f}", label, pct(m["accuracy"]),
                             difference(m["change"]["diff"], m["change"]["ci95"], in_points)
                             + " pts", interval(m["kl"], m["kl_ci95"], _kl)])
    return rows


def _kl(x: float) -> str:
    return number(x, 4)


def budget_blocks(drift: dict, figure_name: str) -> list:
    """Drift along the budget runs: the table and its figure."""
    ref = drift["reference"]
    return [Heading(3, "Drift against training budget"), Paragraph(
        f"Every checkpoint along {len(drift['runs'])} training run(s) of --budget-runs read "
        f"the same way on the same off-task sets, placed by the run's generated training "
        f"samples and its training loop's own seconds, summed to the checkpoint: drift that "
        f"grows with training shows as a falling accuracy change and a growing KL down each "
        f"run."),
        Table(["run", "step", "samples", "seconds", "set", "greedy",
               f"greedy - {ref} [95% CI]", f"KL to {ref} [95% CI]"], budget_rows(drift)),
        Figure(figure_name, f"Drift against budget: greedy accuracy change against {ref} "
               f"(top) and KL to {ref} (bottom) on each off-task set against generated training "
               f"samples, one line per run from {ref} at 0, with 95% bootstrap intervals.")]


def figures(comp: dict, folder: Path) -> dict[str, str]:
    """The drift figure, and the drift-against-budget figure where budget runs were read."""
    drift = comp["drift"]
    out = {"drift": figure(drift, folder / "drift.png")}
    if drift["runs"]:
        out["drift_budget"] = budget_figure(drift, folder / "drift_budget.png")
    return out


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """Off-task drift: accuracy and KL to the reference on the sets no model trained on."""
    drift = comp["drift"]
    ref = drift["reference"]
    out: list = [Heading(2, "Off-task drift"), Paragraph(
        f"Every model read greedily on problem sets it was not trained on, against {ref}: "
        f"the paired accuracy change with its 95% bootstrap interval over problems, and the "
        f"mean per-token KL(model || {ref}) on the model's own greedy completions of the first "
        f"problems of each set (teacher-forced through both models, averaged over each "
        f"completion's tokens, then over the prompts, with its 95% bootstrap interval over "
        f"those prompts). ES drifting off-task while GRPO holds "
        f"would show as a falling accuracy and a growing KL for ES alone.")]
    for t in drift["tasks"]:
        rows = [[name, pct(m["accuracy"]),
                 difference(m["change"]["diff"], m["change"]["ci95"], in_points) + " pts",
                 interval(m["kl"], m["kl_ci95"], _kl)] for name, m in t["models"].items()]
        out.append(Paragraph(f"**{t['label']}** (task {t['task']}): {t['num_problems']} "
                             f"problems, KL over the first {t['kl_prompts']}."))
        out.append(Table(["model", "greedy", f"greedy - {ref} [95% CI]",
                          f"KL to {ref} [95% CI]"], rows))
    out.append(Figure(figures["drift"], f"Greedy accuracy change against {ref} on each "
                      f"off-task set, with its 95% bootstrap interval over problems."))
    if drift["runs"]:
        out += budget_blocks(drift, figures["drift_budget"])
    return out


SECTIONS.register("drift")(Section(
    place=150, enabled=lambda cfg: cfg.drift.enabled, check=check, compute=compute,
    blocks=blocks, figures=figures))
