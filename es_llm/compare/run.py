"""``es-llm compare``: sample every model with identical settings (or reuse its samples), then
write comparison.json, the figures, report.md and report.html."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from es_llm.backends import BACKEND_NAMES, choose_backend
from es_llm.compare import budget
from es_llm.compare.analysis import compare_sets
from es_llm.compare.blind_spot import BlindSpotConfig, diagnose
from es_llm.compare.testtime import TestTimeCompare, check_testtime, run_testtime
from es_llm.compare.capability import capability, view_label
from es_llm.compare.difficulty import difficulty
from es_llm.compare.figures import draw_all
from es_llm.compare.report import summary_rows, to_markdown, write_report
from es_llm.compare.samples import SETTING_KEYS, align, check_name, load_samples, samples_path
from es_llm.config import (check_choices, choice, dump_yaml, load_yaml_text, run_config_yaml,
                           to_dict)
from es_llm.errors import BadInput
from es_llm.evaluate import (
    EvalConfig,
    SamplingConfig,
    check_model_path,
    evaluate,
    resolve_task_config,
)
from es_llm.io import complete_jsonl_rows, jsonl_lines, write_json_atomic, write_text_atomic
from es_llm.machine import machine_kind
from es_llm.metrics.summary import json_safe
from populations.numbers import is_finite_number
from es_llm.run_folder import check_out_path, recorded_machine
from es_llm.tasks import TaskConfig, build_task


@dataclass(frozen=True)
class CompareConfig:
    # Models as NAME=PATH: PATH is a model folder (sampled here), an eval folder or a
    # samples.jsonl (reused). NAME is a method, or method@seed for one of its training seeds.
    models: tuple[str, ...] = ()
    # The model (or method) progressions, regressions and differences are measured against.
    reference: str = "base"
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Generation backend for the models sampled here: auto (vLLM when installed), hf or vllm.
    backend: str = choice("auto", lambda: BACKEND_NAMES)
    # Bootstrap resamples over problems for each 95% interval.
    bootstrap: int = 1000
    # Seed of the bootstrap resamples and of the diversity subsamples.
    metrics_seed: int = 0
    # Capability or sharpening (es_llm/compare/capability.py): when either list is set, every
    # model folder is also read greedily (one sample at T = 0) and sampled at each of these
    # temperatures and at sampling.temperature (views_n samples per problem, the other
    # sampling settings as given), on the task's problems and on each `also_on` file; the
    # report adds greedy accuracy, pass@1, pass@n, answer entropy and the sharpening gap
    # side by side.
    temperatures: tuple[float, ...] = ()
    # More problem files to read the models on, e.g. a never-seen Countdown set from
    # scripts/unseen_countdown.py.
    also_on: tuple[str, ...] = ()
    # Samples per problem in the sampled capability views (null = sampling.n): a large
    # never-seen set is read well with fewer samples per problem.
    views_n: int | None = None
    # Accuracy against training budget: every checkpoint along budget.runs read on one
    # problem set, placed by generated samples and by training seconds.
    budget: budget.BudgetConfig = field(default_factory=budget.BudgetConfig)
    # Per-problem difficulty for the "gains by difficulty" section (besides the reference's
    # failure rate and the problems' tiers): a JSONL file with an `id` and this column per
    # problem, e.g. human error rates; every compared problem needs a value.
    difficulty_file: str | None = None
    # The column of difficulty_file that holds each problem's difficulty.
    difficulty_column: str = "difficulty"
    blind_spot: BlindSpotConfig = field(default_factory=BlindSpotConfig)
    # Test-time methods on every model folder (es_llm/compare/testtime.py).
    testtime: TestTimeCompare = field(default_factory=TestTimeCompare)

    def __post_init__(self):
        check_choices(self)
        if self.bootstrap < 10:
            raise BadInput(f"bootstrap must be at least 10 resamples, got {self.bootstrap}.")
        if any(not t > 0 for t in self.temperatures):
            raise BadInput(f"temperatures must be above 0 (greedy is always read when views "
                           f"are on), got {list(self.temperatures)}.")
        if self.views_n is not None and self.views_n < 1:
            raise BadInput(f"views_n must be at least 1 (or null for sampling.n), got "
                           f"{self.views_n}.")

    def views(self) -> list[tuple[str | None, float]]:
        """(data file or None for the task's own, temperature) of every capability view,
        greedy first in each set; [] when capability views are off."""
        if not self.temperatures and not self.also_on:
            return []
        temps = [0.0] + sorted({*self.temperatures, self.sampling.temperature} - {0.0})
        return [(data, t) for data in (None, *self.also_on) for t in temps]


# A model may not be named like a config key (NAME=PATH would read as an override).
RESERVED = frozenset(f.name for f in dataclasses.fields(CompareConfig))


def parse_models(entries: tuple[str, ...]) -> list[tuple[str, str]]:
    out = []
    for entry in entries:
        if "=" not in entry:
            raise BadInput(f"--models entry {entry!r} is not NAME=PATH (e.g. base=runs/testbed "
                           f"es@0=runs/es-0/checkpoints/final).")
        name, path = entry.split("=", 1)
        if name in RESERVED:
            raise BadInput(f"model name {name!r} is reserved for a config key; pick another.")
        out.append((check_name(name), path))
    if not out:
        raise BadInput("nothing to compare: give models as --models NAME=PATH NAME=PATH ...")
    return out


def run_folder_of(model_path: Path) -> Path | None:
    """The training run a checkpoint came from (RUN/checkpoints/<name>), if it has metrics."""
    run = model_path.resolve().parent.parent
    if model_path.resolve().parent.name == "checkpoints" and (run / "metrics.jsonl").is_file():
        return run
    return None


def _same_eval(folder: Path, cfg: EvalConfig) -> bool:
    """An earlier run of this comparison already sampled this model with these settings."""
    try:
        old = load_yaml_text((folder / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    new = to_dict(resolve_task_config(cfg))  # evaluate() records the resolved data file
    return (folder / "samples.jsonl").is_file() and all(
        old.get(k) == new.get(k) for k in ("model", "task", "sampling", "backend"))


def sample_model(name: str, model: Path, cfg: CompareConfig, folder: Path, progress: bool) -> Path:
    """Evaluate one model folder into ``folder`` (skipped when already there). vLLM engines
    share process-wide state, so each vLLM evaluation runs in its own process."""
    ev = EvalConfig(model=str(model), task=cfg.task, sampling=cfg.sampling, backend=cfg.backend,
                    bootstrap=cfg.bootstrap, metrics_seed=cfg.metrics_seed)
    if _same_eval(folder, ev):
        print(f"[compare] {name}: reusing {folder / 'samples.jsonl'}")
        return folder
    # In this process unless vLLM serves it (its engines share process-wide state).
    if choose_backend(cfg.backend, str(model)) != "vllm":
        evaluate(ev, folder, progress=progress, echo=lambda *_: None)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "request.yaml", dump_yaml(ev))
    cmd = [sys.executable, "-m", "es_llm", "eval", "--config", str(folder / "request.yaml"),
           "--out", str(folder)] + ([] if progress else ["--no-progress"])
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    (folder / "request.yaml").unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise (BadInput if proc.returncode == 2 else RuntimeError)(
            f"sampling model {name} ({model}) failed: {tail[0]}")
    return folder


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


def check_inputs(cfg: CompareConfig, out: Path) -> tuple[list, dict, dict[str, Path]]:
    """Everything a comparison needs, checked before anything is sampled or written:
    ``([(name, path, run folder or None)], {name: SampleSet}, {name: model folder})``, the
    second holding the inputs that are sample files (loaded and checked against each other
    here), the third the blind spot's model folders (empty when it is off)."""
    entries = parse_models(cfg.models)
    check_out_path(out)
    names = [n for n, _ in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput(f"model name(s) {', '.join(dup)} given more than once; names must be "
                       f"unique (use method@seed for several training seeds).")
    if cfg.reference not in names and cfg.reference not in {n.split("@")[0] for n in names}:
        raise BadInput(f"reference {cfg.reference!r} is none of the models ({', '.join(names)}); "
                       f"set --reference NAME.")
    sources, loaded = [], {}
    for name, path in entries:
        p = Path(path)
        if p.is_dir() and (p / "config.json").is_file():
            check_model_path(path, f"model {name}")
            sources.append((name, p, run_folder_of(p)))
            continue
        try:
            samples_path(p)
        except BadInput:
            raise BadInput(f"model {name}: {path!r} is not a model folder (config.json and "
                           f"weights), an eval folder or a samples.jsonl file.") from None
        loaded[name] = load_samples(name, p)
        sources.append((name, p, None))
    if len(loaded) > 1:
        align(list(loaded.values()))
    if len(loaded) < len(entries):
        wanted = to_dict(cfg.sampling)
        for s in loaded.values():
            off = [k for k in SETTING_KEYS if k in s.settings and s.settings[k] != wanted[k]]
            if off:
                raise BadInput(f"{s.source} ({s.name}) was sampled with "
                               f"{', '.join(f'{k}={s.settings[k]!r}' for k in off)}, but the "
                               f"models sampled here would get "
                               f"{', '.join(f'{k}={wanted[k]!r}' for k in off)}; a comparison "
                               f"needs identical sampling settings.")
    if cfg.views():
        _check_views(cfg, loaded)
    if cfg.budget.runs:
        budget_data(cfg, sources)
        budget.parse_runs(cfg.budget.runs)
    folders = blind_spot_models(cfg, sources, loaded) if cfg.blind_spot.enabled else {}
    if cfg.testtime.methods:
        check_testtime(cfg, sources, loaded)
    return sources, loaded, folders


def blind_spot_models(cfg: CompareConfig, sources: list, loaded: dict) -> dict[str, Path]:
    """The model folder behind each compared model, checked for the blind spot: a causal
    decoder the HF backend serves, the layer in range, at least k samples per problem."""
    from transformers import AutoConfig

    from es_llm.backends.diffusion import is_diffusion_model

    b = cfg.blind_spot
    if cfg.task.name != "countdown":
        raise BadInput(f"--blind-spot's reorder graft lists a Countdown problem's numbers in "
                       f"another order, so it needs task countdown (got {cfg.task.name!r}).")
    out = {}
    for name, path, _ in sources:
        n = loaded[name].n if name in loaded else cfg.sampling.n
        if n < b.k:
            raise BadInput(f"--blind-spot needs at least blind_spot.k={b.k} samples per "
                           f"problem to find the never-solved ones, but {name} has n={n}; "
                           f"sample with --n {b.k} or more, or lower blind_spot.k.")
        folder = path if path.is_dir() and (path / "config.json").is_file() else (
            Path(loaded[name].model) if name in loaded and loaded[name].model else None)
        if folder is None or not (folder / "config.json").is_file():
            raise BadInput(f"--blind-spot runs {name}'s model, but {path} records no model "
                           f"folder; give the model folder (or an eval folder whose "
                           f"config.yaml names one).")
        if is_diffusion_model(str(folder)):
            raise BadInput(f"--blind-spot grafts activations into a causal decoder's layers; "
                           f"{name} ({folder}) is a masked-diffusion model.")
        layers = getattr(AutoConfig.from_pretrained(folder), "num_hidden_layers", None)
        if not isinstance(layers, int) or not -layers <= b.layer < layers:
            raise BadInput(f"blind_spot.layer={b.layer} is out of range for {name}: it has "
                           f"{layers} decoder layers (0..{(layers or 1) - 1}, or negative "
                           f"from the end).")
        out[name] = folder
    return out


def compared_task(cfg: CompareConfig, model: Path):
    """The compared task, its data resolved against ``model`` (the model's training data
    when ``cfg.task`` names none); the caller closes it."""
    return build_task(resolve_task_config(EvalConfig(model=str(model), task=cfg.task)).task)


def run_blind_spot(cfg: CompareConfig, sets: list, folders: dict[str, Path], echo) -> dict:
    """The blind-spot figures of every model (``blind_spot.diagnose``); ``folders`` from
    ``blind_spot_models``."""
    from es_llm.backends.hf import HFBackend

    task = compared_task(cfg, next(iter(folders.values())))
    try:
        problems = {p.id: p for p in task.problems()}
        models = {}
        for s in sets:
            echo(f"[compare] blind spot: {s.name}")
            models[s.name] = diagnose(HFBackend(str(folders[s.name])), task, problems, s,
                                      cfg.blind_spot, cfg.sampling.max_tokens, cfg.metrics_seed)
    finally:
        task.close()
    return {"config": to_dict(cfg.blind_spot), "models": models}


def _compared_ids(cfg: CompareConfig, sources: list, loaded: dict) -> list[str]:
    """The problem ids the comparison will cover, known before anything is sampled."""
    if loaded:
        return list(next(iter(loaded.values())).problem_ids)
    task = compared_task(cfg, next(path for _, path, _ in sources))
    try:
        return [p.id for p in task.problems()]
    finally:
        task.close()


def difficulty_file(cfg: CompareConfig, sources: list, loaded: dict) -> dict | None:
    """``{"name", "values": {problem id: float}}`` from ``cfg.difficulty_file``, or None;
    BadInput when the file is unreadable or misses a compared problem."""
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
    missing = [pid for pid in _compared_ids(cfg, sources, loaded) if pid not in values]
    if missing:
        raise BadInput(f"{path} has no '{column}' for {len(missing)} of the compared problems "
                       f"(e.g. {missing[0]!r}); every problem needs a difficulty value.")
    return {"name": column, "values": values}


def budget_data(cfg: CompareConfig, sources: list) -> tuple[Path, Path]:
    """(reference model folder, problem file) of the budget study, or BadInput."""
    ref = [(name, path) for name, path, _ in sources if name == cfg.reference]
    if not ref or not (ref[0][1] / "config.json").is_file():
        raise BadInput(f"--budget-runs reads the checkpoints against the reference model, so "
                       f"--reference must name one model folder among --models (got "
                       f"{cfg.reference!r}).")
    data = cfg.budget.data or (cfg.also_on[0] if cfg.also_on else None)
    if data is None:
        ev = resolve_task_config(EvalConfig(model=str(ref[0][1]), task=cfg.task))
        data = ev.task.data
    if data is None or not Path(data).is_file():
        raise BadInput(f"the budget study has no problem file to read the checkpoints on "
                       f"({data!r}); set budget.data=FILE, give --also-on FILE, or use a "
                       f"reference model with a held-out set (a testbed model).")
    return ref[0][1], Path(data)


def _check_views(cfg: CompareConfig, loaded: dict) -> None:
    """Capability views sample every model again, so every model must be a folder, and every
    ``also_on`` file must hold problems of the task."""
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
    for data, temperature in cfg.views():
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


def run_budget_study(cfg: CompareConfig, sources: list, out: Path, progress: bool) -> dict:
    """The budget study's reads under OUT/samples/budget/, each sampled like every other model
    of the comparison (same seed, max_tokens, top_p and backend)."""
    reference, data = budget_data(cfg, sources)

    def read(model: str, problems: Path, n: int, temperature: float, folder: Path) -> Path:
        view = replace(cfg, task=replace(cfg.task, data=str(problems)),
                       sampling=replace(cfg.sampling, n=n, temperature=temperature),
                       backend=cfg.budget.backend or cfg.backend)
        return sample_model(str(folder.relative_to(out)), Path(model), view, folder,
                            progress) / "samples.jsonl"

    result = budget.study(cfg.budget, reference, data, out / "samples" / "budget", read,
                          np.random.default_rng(cfg.metrics_seed), cfg.bootstrap)
    return {"reference": cfg.reference, **result}


def machines(sets: list) -> dict[str, dict]:
    """Per model, the machine kind (``machine_kind``) it was trained or built on and the one
    its samples were drawn on, where recorded."""
    out = {}
    for s in sets:
        model = s.run or s.model
        trained = None
        if model:
            folder = Path(model)
            trained = recorded_machine(folder) or recorded_machine(folder.parent.parent)
        out[s.name] = {"trained": machine_kind(trained) if trained else None,
                       "sampled": machine_kind(s.machine) if s.machine else None}
    return out


def compare(cfg: CompareConfig, out: str | Path, progress: bool = True, echo=print,
            on_folder=None) -> dict:
    """Run ``es-llm compare``: check every input, sample what needs sampling, write the
    report. ``on_folder(out)`` is called once the output folder exists."""
    out = Path(out)
    sources, loaded, blind_spot_folders = check_inputs(cfg, out)
    item_difficulty = difficulty_file(cfg, sources, loaded)
    out.mkdir(parents=True, exist_ok=True)
    if on_folder is not None:
        on_folder(out)
    sets = []
    for name, path, run in sources:
        if name in loaded:
            sets.append(loaded[name])
            continue
        folder = sample_model(name, path, cfg, out / "samples" / name, progress)
        sets.append(load_samples(name, folder, run=str(run) if run else None))
    sets = align(sets)
    comp = compare_sets(sets, cfg.reference, np.random.default_rng(cfg.metrics_seed),
                        cfg.bootstrap)
    views = []
    for label, temperature, folder, view in view_folders(cfg, out):
        if view.task == cfg.task and view.sampling == cfg.sampling:
            views.append({"data": label, "temperature": temperature, "sets": sets})
            continue
        echo(f"[compare] {label}, {view_label(temperature)}")
        views.append({"data": label, "temperature": temperature, "sets": align([
            load_samples(name, sample_model(name, path, view, folder / name, progress))
            for name, path, _ in sources])})
    if views:
        comp["capability"] = capability(views, cfg.reference,
                                        np.random.default_rng(cfg.metrics_seed), cfg.bootstrap)
    comp["difficulty"] = difficulty(sets, cfg.reference, np.random.default_rng(cfg.metrics_seed),
                                    cfg.bootstrap, item_difficulty)
    if cfg.blind_spot.enabled:
        comp["blind_spot"] = run_blind_spot(cfg, sets, blind_spot_folders, echo)
    if cfg.testtime.methods:
        echo(f"[compare] test-time methods {', '.join(cfg.testtime.methods)}")
        comp["testtime"] = run_testtime(cfg, sources, out, progress)
    if cfg.budget.runs:
        echo(f"[compare] accuracy along {len(cfg.budget.runs)} training runs")
        comp["budget_study"] = run_budget_study(cfg, sources, out, progress)
    curves = {s.name: training_curve(Path(s.run)) for s in sets if s.run}
    comp["training"] = {k: v for k, v in curves.items() if v}
    samples_per_run: dict[str, list[float]] = {}
    for name, c in comp["training"].items():
        samples_per_run.setdefault(name.split("@")[0], []).append(c["samples"][-1])
    comp["budget"] = samples_per_run
    comp["machines"] = machines(sets)
    comp["config"] = to_dict(cfg)
    figures = draw_all(comp, out / "figures")
    comp["figures"] = figures
    comp = json_safe(comp)
    write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
    write_json_atomic(out / "comparison.json", comp)
    write_report(comp, figures, out)
    echo(to_markdown([("table", ["comparison", "metric", "first", "second",
                                 "first - second [95% CI]", "verdict"], summary_rows(comp))]))
    echo(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'comparison.json'}")
    return comp
