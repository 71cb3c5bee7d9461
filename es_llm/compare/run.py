"""``es-llm compare``: check every input, sample every model with identical settings (or reuse
its samples), then compute, draw and write each enabled section (``es_llm.compare.section``)
in its place: comparison.json, the figures, report.md and report.html."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import yaml

# Every section registers itself when its module is imported; these are all of them.
from es_llm.compare import (blind_spot, budget, capability, connectivity,  # noqa: F401
                            conversion, core, difficulty, drift, geometry, runs, testtime)
from es_llm.compare.config import CompareConfig
from es_llm.compare.core import summary_table
from es_llm.compare.samples import SETTING_KEYS, align, check_name, load_samples, samples_path
from es_llm.compare.sampling import compared_task, sample_model
from es_llm.compare.section import CheckInput, SectionInput, Source, sections
from es_llm.config import load_yaml_text, run_config_yaml, to_dict
from es_llm.errors import BadInput
from es_llm.io import write_json_atomic, write_text_atomic
from es_llm.metrics.summary import json_safe
from es_llm.models import check_model_path
from es_llm.overlap import check_overlap
from es_llm.report import to_markdown, write_report
from es_llm.run_folder import check_out_path

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


def _sources(cfg: CompareConfig, entries: list[tuple[str, str]]) -> tuple[tuple[Source, ...], dict]:
    """Every model as given, and the ones given as sample files loaded and checked against
    each other and against the settings the others will be sampled with."""
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
            sources.append(Source(name, p, run_folder_of(p)))
            continue
        try:
            samples_path(p)
        except BadInput:
            raise BadInput(f"model {name}: {path!r} is not a model folder (config.json and "
                           f"weights), an eval folder or a samples.jsonl file.") from None
        loaded[name] = load_samples(name, p)
        sources.append(Source(name, p, None))
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
    return tuple(sources), loaded


def training_dtype(run: Path) -> str:
    """The precision a training run computed in: its config.yaml's ``runtime.dtype`` (runs
    older than the runtime section: ES's top-level ``dtype``, else float32)."""
    try:
        saved = load_yaml_text((run / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        saved = None
    if not isinstance(saved, dict):
        raise BadInput(f"the training run {run} has no readable config.yaml, so the precision "
                       f"it trained at is unknown; compare its checkpoint as a copied model "
                       f"folder or restore the file.")
    runtime = saved.get("runtime") if isinstance(saved.get("runtime"), dict) else {}
    return str(runtime.get("dtype") or saved.get("dtype") or "float32")


def check_precisions(cfg: CompareConfig, sources: tuple[Source, ...]) -> None:
    """BadInput when the compared training runs computed at different precisions, unless
    ``mixed_precision`` allows it: precision alone moves accuracy and diversity."""
    dtypes = {s.name: training_dtype(s.run) for s in sources if s.run is not None}
    if len(set(dtypes.values())) > 1 and not cfg.mixed_precision:
        raise BadInput(f"the compared runs trained at different precisions ("
                       f"{', '.join(f'{n}: {d}' for n, d in dtypes.items())}, from each run's "
                       f"runtime.dtype), so a difference between them may be the precision's. "
                       f"Train them at one runtime.dtype, or set mixed_precision=true to "
                       f"compare them anyway.")


def check_inputs(cfg: CompareConfig, out: Path) -> tuple[tuple[Source, ...], dict, dict]:
    """Everything a comparison needs, checked before anything is sampled or written:
    ``(sources, {name: SampleSet}, {section name: what its check returned})``, the second
    holding the inputs that are sample files."""
    entries = parse_models(cfg.models)
    check_out_path(out)
    sources, loaded = _sources(cfg, entries)
    check_precisions(cfg, sources)
    inp = CheckInput(cfg, sources, loaded)
    return sources, loaded, {name: s.check(inp) for name, s in sections(cfg) if s.check}


def check_overlaps(cfg: CompareConfig, sources: tuple[Source, ...], loaded: dict, echo) -> None:
    """Every model folder that is a training run's checkpoint, checked against the run's
    training problems (``es_llm.overlap``): a warning, or BadInput with strict_overlap."""
    for src in sources:
        if src.name in loaded:
            continue
        task = compared_task(cfg, src.path)
        try:
            check_overlap(task.problems(), src.path, cfg.strict_overlap,
                          lambda text, name=src.name: echo(f"[compare] {name}: {text}"))
        finally:
            task.close()


def _sample_sets(cfg: CompareConfig, sources: tuple[Source, ...], loaded: dict, out: Path,
                 progress: bool) -> tuple:
    """Every model's samples, aligned: the loaded ones, and the model folders sampled into
    OUT/samples/NAME (or reused from an identical earlier run)."""
    sets = []
    for src in sources:
        if src.name in loaded:
            sets.append(loaded[src.name])
            continue
        folder = sample_model(src.name, src.path, cfg, out / "samples" / src.name, progress)
        sets.append(load_samples(src.name, folder, run=str(src.run) if src.run else None))
    return tuple(align(sets))


def compute_all(inp: SectionInput, checked: dict) -> dict:
    """comparison.json's entries from every enabled section's compute, in order; ``checked``:
    what each section's check returned, by section name."""
    comp: dict = {}
    for name, section in sections(inp.cfg):
        if section.compute:
            part = section.compute(replace(inp, checked=checked.get(name))).to_json()
            taken = sorted(set(part) & set(comp))
            if taken:
                raise ValueError(f"section {name} writes comparison.json keys {taken}, which "
                                 f"another section wrote")
            comp.update(part)
    return comp


def draw_all(cfg: CompareConfig, comp: dict, folder: Path) -> dict[str, str]:
    """Every enabled section's figures into ``folder``; returns figure key -> file name."""
    folder.mkdir(parents=True, exist_ok=True)
    figures: dict[str, str] = {}
    for _, section in sections(cfg):
        if section.figures:
            figures.update(section.figures(comp, folder))
    return figures


def report_blocks(cfg: CompareConfig, comp: dict, figures: dict[str, str]) -> list:
    """The report: every enabled section's blocks, in order."""
    return [block for _, section in sections(cfg) for block in section.blocks(comp, figures)]


def compare(cfg: CompareConfig, out: str | Path, progress: bool = True, echo=print,
            on_folder=None) -> dict:
    """Run ``es-llm compare``: check every input, sample what needs sampling, write the
    report. ``on_folder(out)`` is called once the output folder exists."""
    out = Path(out)
    sources, loaded, checked = check_inputs(cfg, out)
    check_overlaps(cfg, sources, loaded, echo)
    out.mkdir(parents=True, exist_ok=True)
    if on_folder is not None:
        on_folder(out)
    sets = _sample_sets(cfg, sources, loaded, out, progress)
    comp = compute_all(SectionInput(cfg, sources, sets, out, progress, echo), checked)
    comp["config"] = to_dict(cfg)
    figures = draw_all(cfg, comp, out / "figures")
    comp["figures"] = figures
    comp = json_safe(comp)
    write_text_atomic(out / "config.yaml", run_config_yaml(cfg))
    write_json_atomic(out / "comparison.json", comp)
    write_report(out, report_blocks(cfg, comp, figures))
    echo(to_markdown([summary_table(comp)]))
    echo(f"wrote {out / 'report.md'}, {out / 'report.html'} and {out / 'comparison.json'}")
    return comp
