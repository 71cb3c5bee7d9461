"""Build the embedded testbed (see ``train.py`` for what the model is made of), cache it by
its fingerprint, report its pass@k, and copy it where the user asked.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch

from es_llm.backends.base import SamplingParams
from es_llm.config import dump_yaml, to_dict
from es_llm.errors import BadInput
from es_llm.machine import machine_info, machine_kind
from es_llm.run_folder import check_out_path
from es_llm.io import (make_temp_dir, replace_dir_atomic, share_tree, write_json_atomic,
                       write_jsonl_atomic, write_text_atomic)
from es_llm.testbed.config import MODEL_TASKS, TestbedConfig
from es_llm.testbed.teachers import build_weak_pair, save_model
from es_llm.testbed.tokenizer import build_tokenizer
from es_llm.testbed.train import held_out_sets, make_model, record, train

TEACHERS = ("strong", "weak_base", "weak_rl")


def cache_root() -> Path:
    return Path(os.environ.get("ES_LLM_CACHE", Path.home() / ".cache" / "es-llm")) / "testbed"


def _count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _held_out_task(folder: Path, split: str, name: str = "countdown"):
    """Task ``name`` on a build's held-out file ``data/<name>_<split>.jsonl``."""
    from es_llm.tasks import TaskConfig, build_task
    data = folder / "data" / f"{name}_{split}.jsonl"
    return build_task(TaskConfig(name=name, data=str(data)))


def _report(model_dir: Path, data_dir: Path, cfg: TestbedConfig, progress: bool,
            samples: int | None = None, backend=None, task_name: str = "countdown") -> dict:
    """pass@k of a fresh model on a held-out set (Countdown unless ``task_name`` says which),
    with the transformers backend or the one given."""
    from es_llm.backends import BackendSpec, make_backend
    from es_llm.evaluate import metrics_from_rows, sample_and_score

    r = cfg.report
    n = samples or r.samples
    task = _held_out_task(data_dir, "eval", task_name)
    try:
        params = SamplingParams(n=n, temperature=r.temperature, max_tokens=r.max_tokens,
                                seed=cfg.seed)
        backend = backend or make_backend(BackendSpec(str(model_dir), backend="hf"))
        rows = sample_and_score(backend, task, task.problems(), params, progress)
    finally:
        task.close()
    m = metrics_from_rows(rows, n, bootstrap=200)
    top = f"pass@{n}"
    return {"samples": n, "temperature": r.temperature,
            "pass@1": m["pass@1"]["value"], top: m[top]["value"],
            "by_difficulty": m.get("by_difficulty", {})}


def _build_into(tmp: Path, cfg: TestbedConfig, progress: bool, echo) -> dict:
    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    sets, excluded = held_out_sets(cfg)
    for name, problems in sets.items():
        write_jsonl_atomic(tmp / "data" / f"{name}.jsonl", [record(p) for p in problems])
    model = make_model(cfg, tokenizer)
    threads = torch.get_num_threads()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:
        stats = train(model, tokenizer, cfg, excluded, progress)
    finally:
        torch.set_num_threads(threads)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    train_s = time.perf_counter() - t0
    report = _report(tmp, tmp, cfg, progress)
    info = {"size": cfg.size, "fingerprint": cfg.fingerprint(), "parameters": _count_params(model),
            "machine": machine_info(), "train": stats, "build_s": round(train_s, 1),
            "held_out": {k: len(v) for k, v in sets.items()}, "report": report,
            "config": to_dict(cfg)}
    write_text_atomic(tmp / "testbed.yaml", dump_yaml(cfg))
    write_json_atomic(tmp / "testbed.json", info)
    return info


def pretrain(cfg: TestbedConfig, shape, schedule, tokenizer, excluded: set, progress: bool):
    """A fresh model of ``shape`` pretrained on the student's mix with ``schedule`` (the
    stronger teacher, the weak base): ``train.py``'s model and loop, which the student's
    fingerprint (part of every teacher's cache key) already covers."""
    sub = replace(cfg, model=shape, train=schedule)
    model = make_model(sub, tokenizer)
    return model, train(model, tokenizer, sub, excluded, progress)


def _teacher_info(folder: Path, data_dir: Path, cfg: TestbedConfig, progress: bool) -> dict:
    from transformers import AutoConfig
    shape = AutoConfig.from_pretrained(folder)
    return {"hidden_size": shape.hidden_size,
            "num_layers": shape.num_hidden_layers,
            "report": _report(folder, data_dir, cfg, progress, cfg.teachers.report_samples)}


def _strong_into(tmp: Path, student: Path, cfg: TestbedConfig, progress: bool) -> None:
    """The stronger teacher: a larger model pretrained longer (``pretrain``)."""
    s = cfg.teachers.strong
    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    _, excluded = held_out_sets(cfg)
    model, stats = pretrain(cfg, s.model, s.train, tokenizer, excluded, progress)
    save_model(model, tokenizer, tmp)
    info = {"strong": {"train": stats,
                       **_teacher_info(tmp, student, cfg, progress),
                       "build_s": round(time.perf_counter() - t0, 1)}}
    write_json_atomic(tmp / "testbed.json", info)


def _weak_into(tmp: Path, student: Path, cfg: TestbedConfig, progress: bool) -> None:
    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    _, excluded = held_out_sets(cfg)
    rl_task = _held_out_task(student, "rl")
    try:
        w = cfg.teachers.weak
        info = build_weak_pair(tmp, cfg, pretrain(cfg, w.model, w.train, tokenizer, excluded,
                                                  progress),
                               tokenizer, rl_task, rl_task.problems(), progress)
    finally:
        rl_task.close()
    for name in ("weak_base", "weak_rl"):
        info[name].update(_teacher_info(tmp / name, student, cfg, progress))
    info["weak_rl"]["build_s"] = round(time.perf_counter() - t0, 1)
    write_json_atomic(tmp / "testbed.json", info)


def _diffusion_into(tmp: Path, student: Path, cfg: TestbedConfig, progress: bool) -> None:
    """The masked-diffusion model (``diffusion.py``), its sampler settings and its pass@k."""
    from es_llm.backends import BackendSpec, make_backend
    from es_llm.backends.diffusion import SAMPLING_FILE
    from es_llm.testbed.diffusion import make_diffusion_model, train_diffusion

    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    _, excluded = held_out_sets(cfg)
    model = make_diffusion_model(cfg, tokenizer)
    stats = train_diffusion(model, tokenizer, cfg, excluded, progress)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    write_json_atomic(tmp / SAMPLING_FILE, to_dict(cfg.diffusion.sampling))
    build_s = round(time.perf_counter() - t0, 1)
    # The folder now holds the sampler settings, so the factory serves it with the diffusion
    # sampler, decoding with the model just trained.
    backend = make_backend(BackendSpec(str(tmp), backend="hf", model=model, tokenizer=tokenizer))
    info = {"diffusion": {"train": stats, "parameters": _count_params(model), "build_s": build_s,
                          "sampling": to_dict(cfg.diffusion.sampling),
                          "report": _report(tmp, student, cfg, progress, backend=backend)}}
    write_json_atomic(tmp / "testbed.json", info)


def _domain_into(tmp: Path, name: str, cfg: TestbedConfig, progress: bool) -> None:
    """A domain model (``domains.py``), its held-out sets and its pass@k on them; a model
    that learned several roles also gets ``roles.json`` (``es_llm.testtime.roles``)."""
    from es_llm.testbed.domains import build_domain, roles_of

    t0 = time.perf_counter()
    tokenizer = build_tokenizer()
    model, stats = build_domain(name, cfg, tokenizer, tmp, progress)
    save_model(model, tokenizer, tmp)
    roles = roles_of(name)
    if roles:
        from es_llm.testtime.roles import write_roles
        write_roles(tmp, roles)
    build_s = round(time.perf_counter() - t0, 1)
    report = _report(tmp, tmp, cfg, progress, task_name=MODEL_TASKS[name])
    info = {name: {"task": MODEL_TASKS[name], "train": stats, "parameters": _count_params(model),
                   "build_s": build_s, "report": report}}
    write_json_atomic(tmp / "testbed.json", info)


def _swa_into(tmp: Path, student: Path, cfg: TestbedConfig, progress: bool) -> None:
    """The student under sliding-window attention before and after its conversion SFT
    (``swa.py``), each with its pass@k on the student's held-out set."""
    from es_llm.testbed.swa import build_swa

    build_swa(tmp, student, cfg, progress, lambda folder: _report(folder, student, cfg, progress))


def _with_extras(student: Path, cfg: TestbedConfig, progress: bool, echo) -> Path:
    """The student plus what the config enables, each part built once under its own cache
    key: ``teachers/strong``, ``teachers/weak_base``, ``teachers/weak_rl``, ``diffusion/``
    (the masked-diffusion model), the domain models ``code/`` and ``chess/``, and the
    multi-role ``reasoning/``, and the sliding-window conversion ``swa/``."""
    parts: dict[str, Path] = {}
    threads = torch.get_num_threads()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:
        if cfg.teachers.enabled:
            keys = cfg.teacher_keys()
            parts["strong"] = _cached(cache_root() / keys["strong"],
                                      "teacher 'strong' (larger, trained longer)",
                                      lambda tmp: _strong_into(tmp, student, cfg, progress), echo)
            parts["weak"] = _cached(
                cache_root() / keys["weak"],
                "teachers 'weak_base' / 'weak_rl' (smaller, before / after a short RL run)",
                lambda tmp: _weak_into(tmp, student, cfg, progress), echo)
        if cfg.diffusion.enabled:
            parts["diffusion"] = _cached(cache_root() / cfg.diffusion_key(),
                                         "masked-diffusion model 'diffusion'",
                                         lambda tmp: _diffusion_into(tmp, student, cfg, progress),
                                         echo)
        if cfg.swa.enabled:
            parts["swa"] = _cached(cache_root() / cfg.swa_key(),
                                   f"sliding-window conversion 'swa' (window {cfg.swa.window})",
                                   lambda tmp: _swa_into(tmp, student, cfg, progress), echo)
        for name, task in MODEL_TASKS.items():
            if getattr(cfg, name).enabled:
                parts[name] = _cached(
                    cache_root() / cfg.domain_key(name), f"domain model '{name}' ({task})",
                    lambda tmp, name=name: _domain_into(tmp, name, cfg, progress), echo)
    finally:
        torch.set_num_threads(threads)
    if not parts:
        return student

    def assemble(tmp: Path) -> None:
        shutil.copytree(student, tmp, dirs_exist_ok=True)
        info = json.loads((tmp / "testbed.json").read_text())
        if "strong" in parts:
            shutil.copytree(parts["strong"], tmp / "teachers" / "strong",
                            ignore=shutil.ignore_patterns("testbed.json"))
            for name in ("weak_base", "weak_rl"):
                shutil.copytree(parts["weak"] / name, tmp / "teachers" / name)
            info["teachers"] = {**json.loads((parts["strong"] / "testbed.json").read_text()),
                                **json.loads((parts["weak"] / "testbed.json").read_text())}
            for name in TEACHERS:
                info["teachers"][name]["path"] = f"teachers/{name}"
        if "diffusion" in parts:
            shutil.copytree(parts["diffusion"], tmp / "diffusion",
                            ignore=shutil.ignore_patterns("testbed.json"))
            shutil.copytree(student / "data", tmp / "diffusion" / "data")
            info["diffusion"] = json.loads((parts["diffusion"] / "testbed.json").read_text())["diffusion"]
            info["diffusion"]["path"] = "diffusion"
            info["diffusion"]["key"] = parts["diffusion"].name
        for name in ("swa", *MODEL_TASKS):
            if name in parts:
                shutil.copytree(parts[name], tmp / name,
                                ignore=shutil.ignore_patterns("testbed.json"))
                info[name] = json.loads((parts[name] / "testbed.json").read_text())[name]
                info[name]["path"] = name
                # Its cache key: a study reusing this folder checks the part's settings by it.
                info[name]["key"] = parts[name].name
        write_json_atomic(tmp / "testbed.json", info)

    key = f"{cfg.size}-{cfg.fingerprint()}-with-" + "-".join(p.name[-12:] for p in parts.values())
    return _cached(cache_root() / key, f"testbed {cfg.size} with {', '.join(parts)}", assemble,
                   lambda _msg: None)


def check_out_dir(out: Path) -> None:
    """Refuse an --out that replacing would destroy: a file, or a folder that is neither empty
    nor an earlier testbed build."""
    check_out_path(out)
    if out.is_dir() and any(out.iterdir()) and not (out / "testbed.json").is_file():
        raise BadInput(f"--out {str(out)!r} is a non-empty folder that is not a testbed build; "
                       f"it would be replaced, so give a new or empty path instead.")


def _cached(folder: Path, what: str, build, echo) -> Path:
    """``folder`` if it holds a finished build, else ``build(tmp)`` moved there atomically.

    One process builds a key at a time: the builder holds an exclusive lock on
    ``.<key>.lock`` beside it, so a second process asking for the same key waits and then
    reuses the finished build. Holding the lock, the builder also removes the staging
    folders (``.<key>.<random>``) that builders killed mid-build left behind; the kernel
    releases a dead process's lock.
    """
    if (folder / "testbed.json").is_file():
        echo(f"{what} found in cache: {folder}")
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = folder.parent / f".{folder.name}.lock"
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            echo(f"waiting for another process that is building {what} ({folder.name})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        if (folder / "testbed.json").is_file():
            echo(f"{what} found in cache: {folder}")
            return folder
        for stale in folder.parent.glob(f".{folder.name}.*"):
            if stale != lock:
                shutil.rmtree(stale, ignore_errors=True)
        echo(f"building {what} ({folder.name})")
        tmp = make_temp_dir(folder.parent, f".{folder.name}.")
        try:
            build(tmp)
            share_tree(tmp)
            replace_dir_atomic(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def model_or_testbed(model: str | None, size: str) -> tuple[Path, str]:
    """``(folder, label)`` of the model a benchmark runs on: the folder ``model`` when given,
    else the (cached) build of the testbed preset ``size``."""
    if model:
        return Path(model), f"model {Path(model).name}"
    from es_llm.testbed.config import load_testbed_config

    return build_testbed(load_testbed_config(size), progress=False)[0], f"testbed {size}"


def build_testbed(cfg: TestbedConfig, out: str | Path | None = None, progress: bool = True,
                  echo=print) -> tuple[Path, dict]:
    """Build (or reuse from the cache) the testbed for ``cfg``; copy it to ``out`` if given.

    Returns the model folder and its ``testbed.json`` contents.
    """
    if out is not None:
        check_out_dir(Path(out))
    cached = _cached(cache_root() / f"{cfg.size}-{cfg.fingerprint()}", f"testbed {cfg.size}",
                     lambda tmp: _build_into(tmp, cfg, progress, echo), echo)
    cached = _with_extras(cached, cfg, progress, echo)
    info = json.loads((cached / "testbed.json").read_text())
    target = cached
    if out is not None and Path(out).resolve() != cached.resolve():
        target = Path(out)
        target.resolve().parent.mkdir(parents=True, exist_ok=True)
        staging = make_temp_dir(target.resolve().parent, f".{target.name}.")
        try:
            shutil.copytree(cached, staging, dirs_exist_ok=True)
            # The cached folder's testbed.yaml is whichever request built it first (another
            # report setting or enabled part, same student); the copy records this request's.
            write_text_atomic(staging / "testbed.yaml", dump_yaml(cfg))
            share_tree(staging)
            replace_dir_atomic(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target, info


def describe(path: Path, info: dict) -> str:
    r = info["report"]
    top = f"pass@{r['samples']}"
    lines = [f"testbed '{info['size']}' at {path}",
             f"  parameters {info['parameters']:,}  build {info['build_s']} s  "
             f"final loss {info['train']['final_loss']:.3f}",
             f"  built on {machine_kind(info.get('machine') or {}) or 'an unrecorded machine'}",
             f"  held-out countdown: pass@1 {r['pass@1']:.3f}  {top} {r[top]:.3f} "
             f"(n={r['samples']}, T={r['temperature']})"]
    for tier, m in sorted(r.get("by_difficulty", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"    tier {tier}: pass@1 {m['pass@1']:.3f}  pass@{r['samples']} "
                     f"{m['pass@n']:.3f}  ({m['num_problems']} problems)")
    teachers = info.get("teachers", {})
    for name in TEACHERS:
        if name in teachers:
            t, tr = teachers[name], teachers[name]["report"]
            lines.append(f"  teacher {name:9s} {t['path']}  width {t['hidden_size']} x "
                         f"{t['num_layers']} layers  pass@1 {tr['pass@1']:.3f} "
                         f"(n={tr['samples']})")
    if "swa" in info:
        w, top = info["swa"], f"pass@{info['swa']['report']['samples']}"
        for label, r in (("after SFT", w["report"]), ("no SFT", w["no_sft"]["report"])):
            lines.append(f"  swa ({label:9s}) {w['path']}{'' if label == 'after SFT' else '/no_sft'}"
                         f"  window {w['window']}  pass@1 {r['pass@1']:.3f}  {top} {r[top]:.3f}")
    for name in MODEL_TASKS:
        if name in info:
            d, dr = info[name], info[name]["report"]
            top = f"pass@{dr['samples']}"
            lines.append(f"  domain {name:9s} {d['path']}  task {d['task']}  pass@1 "
                         f"{dr['pass@1']:.3f}  {top} {dr[top]:.3f}")
    return "\n".join(lines)
