"""Sample files of the models being compared: loading, naming and the checks that make a
comparison fair (the same problems, the same n, the same sampling settings)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from es_llm.config import load_yaml_text
from es_llm.errors import BadInput
from es_llm.run_folder import recorded_machine

NAME_RE = re.compile(r"^[A-Za-z0-9_-]+(@[A-Za-z0-9_-]+)?$")
# Sampling settings that must agree between the evaluations of a comparison.
SETTING_KEYS = ("n", "temperature", "top_p", "max_tokens", "seed")


@dataclass(frozen=True)
class SampleSet:
    """One model's samples on one problem set, grouped by problem (P problems x n samples).

    ``name`` is ``method`` or ``method@seed`` (training seed); ``run`` is the training run
    folder whose metrics.jsonl holds the training curve, when known."""

    name: str
    source: str
    problem_ids: tuple[str, ...]
    prompts: tuple[str, ...]
    difficulties: tuple
    correct: tuple[np.ndarray, ...]
    answer_keys: tuple[tuple, ...]
    solution_keys: tuple[tuple, ...]
    texts: tuple[tuple[str, ...], ...]
    n: int
    settings: dict
    run: str | None = None
    # The machine the samples were drawn on (their eval folder's config.yaml) and the model
    # folder they came from, if recorded.
    machine: dict | None = None
    model: str | None = None

    @property
    def method(self) -> str:
        return self.name.split("@")[0]

    @property
    def seed(self) -> str | None:
        return self.name.split("@")[1] if "@" in self.name else None


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise BadInput(f"model name {name!r} is not valid: use letters, digits, '_' and '-', "
                       f"optionally followed by '@SEED' for one training seed of a method "
                       f"(e.g. base, es@0, grpo@1).")
    return name


def _settings_beside(samples_path: Path) -> dict:
    """Sampling settings and task from the config.yaml that `es-llm eval` writes next to its
    samples; empty when there is none (a bare samples file)."""
    config = samples_path.parent / "config.yaml"
    if not config.is_file():
        return {}
    try:
        data = load_yaml_text(config.read_text(encoding="utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BadInput(f"{config} is not a valid YAML file ({exc}).".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise BadInput(f"{config} must hold a mapping (the config.yaml `es-llm eval` writes).")
    sampling, task = data.get("sampling") or {}, data.get("task") or {}
    out = {k: sampling[k] for k in SETTING_KEYS if k in sampling}
    if "name" in task:
        out["task"] = task["name"]
    return out


def _model_beside(samples_path: Path) -> str | None:
    """The model folder an `es-llm eval` folder sampled (its config.yaml), if recorded."""
    try:
        data = load_yaml_text((samples_path.parent / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


def _read_rows(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise BadInput(f"{path} line {lineno} is not valid JSON; a samples file has "
                               f"one JSON object per line, as `es-llm eval` writes it.") from None
            missing = [k for k in ("problem_id", "sample_index", "completion", "correct")
                       if k not in row]
            if missing:
                raise BadInput(f"{path} line {lineno} lacks {', '.join(missing)}; samples "
                               f"files need problem_id, sample_index, completion and correct "
                               f"per line (the samples.jsonl of `es-llm eval`).")
            rows.append(row)
    if not rows:
        raise BadInput(f"{path} holds no samples.")
    return rows


def samples_path(path: str | Path) -> Path:
    """The samples.jsonl of ``path``: the file itself or the one inside an eval folder."""
    p = Path(path)
    if p.is_dir() and (p / "samples.jsonl").is_file():
        return p / "samples.jsonl"
    if p.is_file():
        return p
    raise BadInput(f"{str(p)!r} is neither a samples.jsonl file nor a folder holding one.")


def load_samples(name: str, path: str | Path, run: str | None = None) -> SampleSet:
    """Read a samples.jsonl (or the eval folder holding it) into a ``SampleSet``.

    Every problem must have the same number of samples with indices 0..n-1."""
    src = samples_path(path)
    groups: dict[str, list[dict]] = {}
    for row in _read_rows(src):
        groups.setdefault(str(row["problem_id"]), []).append(row)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise BadInput(f"{src} has different numbers of samples per problem ({sorted(sizes)}); "
                       f"pass@k over a comparison needs the same n for every problem.")
    ids, per = list(groups), []
    for pid in ids:
        g = sorted(groups[pid], key=lambda r: r["sample_index"])
        if [r["sample_index"] for r in g] != list(range(len(g))):
            raise BadInput(f"{src}: problem {pid} has sample indices that are not 0..{len(g) - 1}.")
        per.append(g)
    settings = _settings_beside(src)
    n = sizes.pop()
    if "n" in settings and settings["n"] != n:
        raise BadInput(f"{src} has {n} samples per problem but its config.yaml says n="
                       f"{settings['n']}.")
    settings["n"] = n
    return SampleSet(
        name=check_name(name), source=str(src), problem_ids=tuple(ids),
        prompts=tuple(g[0].get("prompt", "") for g in per),
        difficulties=tuple(g[0].get("difficulty", 0) for g in per),
        correct=tuple(np.array([bool(r["correct"]) for r in g]) for g in per),
        answer_keys=tuple(tuple(r.get("answer_key") for r in g) for g in per),
        solution_keys=tuple(tuple(r.get("solution_key") for r in g) for g in per),
        texts=tuple(tuple(str(r["completion"]) for r in g) for g in per),
        n=n, settings=settings, run=run, machine=recorded_machine(src.parent),
        model=_model_beside(src))


def _reorder(s: SampleSet, order: list[int]) -> SampleSet:
    pick = lambda xs: tuple(xs[i] for i in order)  # noqa: E731
    return SampleSet(name=s.name, source=s.source, problem_ids=pick(s.problem_ids),
                     prompts=pick(s.prompts), difficulties=pick(s.difficulties),
                     correct=pick(s.correct), answer_keys=pick(s.answer_keys),
                     solution_keys=pick(s.solution_keys), texts=pick(s.texts), n=s.n,
                     settings=s.settings, run=s.run, machine=s.machine, model=s.model)


def align(sets: list[SampleSet]) -> list[SampleSet]:
    """Check that all sets cover the same problems (ids and prompts) with the same n and the
    same recorded sampling settings, and put every set in the first one's problem order."""
    if not sets:
        raise BadInput("nothing to compare: give at least one model as --models NAME=PATH.")
    names = [s.name for s in sets]
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise BadInput(f"model name(s) {', '.join(dup)} given more than once; names must be "
                       f"unique (use method@seed for several training seeds).")
    ref, out = sets[0], [sets[0]]
    for s in sets[1:]:
        if s.n != ref.n:
            raise BadInput(f"{s.source} ({s.name}) has n={s.n} samples per problem but "
                           f"{ref.source} ({ref.name}) has n={ref.n}; every model needs the "
                           f"same n.")
        missing = sorted(set(ref.problem_ids) - set(s.problem_ids))
        extra = sorted(set(s.problem_ids) - set(ref.problem_ids))
        if missing or extra:
            raise BadInput(
                f"{s.source} ({s.name}) and {ref.source} ({ref.name}) are from different "
                f"problem sets: {len(missing)} of {ref.name}'s {len(ref.problem_ids)} problems "
                f"are missing{f' (e.g. {missing[0]})' if missing else ''} and {len(extra)} "
                f"are extra{f' (e.g. {extra[0]})' if extra else ''}. Sample every model on the "
                f"same held-out set.")
        index = {pid: i for i, pid in enumerate(s.problem_ids)}
        s = _reorder(s, [index[pid] for pid in ref.problem_ids])
        bad = next((pid for pid, a, b in zip(ref.problem_ids, ref.prompts, s.prompts)
                    if a and b and a != b), None)
        if bad is not None:
            raise BadInput(f"problem {bad} has a different prompt in {s.source} than in "
                           f"{ref.source}; the files are from different problem sets.")
        for key in ("task",) + SETTING_KEYS:
            if key in s.settings and key in ref.settings and s.settings[key] != ref.settings[key]:
                raise BadInput(f"{s.source} ({s.name}) was sampled with {key}="
                               f"{s.settings[key]!r} but {ref.source} ({ref.name}) with "
                               f"{key}={ref.settings[key]!r}; a comparison needs identical "
                               f"sampling settings.")
        out.append(s)
    return out
