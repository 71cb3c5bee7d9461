"""Reading the compared models: every sampling run of a comparison (the main one, the
capability views, the budget study's reads) goes through ``sample_model``, and the blind spot
runs its chains on ``blind_spot_backend``. These two are where ``es-llm compare`` itself
chooses or builds a generation backend (its test-time section runs ``es-llm testtime``,
which builds its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from es_llm.backends import BackendSpec, choose_backend, make_backend
from es_llm.compare.config import CompareConfig
from es_llm.config import dump_yaml, load_yaml_text, to_dict
from es_llm.errors import BadInput
from es_llm.evaluate import EvalConfig, evaluate
from es_llm.io import write_text_atomic
from es_llm.models import resolve_task_config
from es_llm.tasks import build_task


def _same_eval(folder: Path, cfg: EvalConfig) -> bool:
    """An earlier run of this comparison already sampled this model with these settings."""
    try:
        old = load_yaml_text((folder / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    new = to_dict(resolve_task_config(cfg))  # evaluate() records the resolved data file
    return (folder / "samples.jsonl").is_file() and all(
        old.get(k) == new.get(k) for k in ("model", "task", "sampling", "backend", "runtime"))


def sample_model(name: str, model: Path, cfg: CompareConfig, folder: Path, progress: bool) -> Path:
    """Evaluate one model folder into ``folder`` (skipped when already there). vLLM engines
    share process-wide state, so each vLLM evaluation runs in its own process."""
    ev = EvalConfig(model=str(model), task=cfg.task, sampling=cfg.sampling, backend=cfg.backend,
                    runtime=cfg.runtime,
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


def blind_spot_backend(folder: Path, cfg: CompareConfig):
    """The backend the blind spot grafts into: HF, whose forward pass takes hooks."""
    return make_backend(BackendSpec(str(folder), backend="hf", runtime=cfg.runtime,
                                    hf_only="the blind spot grafts through the forward hooks "
                                            "of the HF decoding loop"))


def compared_task(cfg: CompareConfig, model: Path):
    """The compared task, its data resolved against ``model`` (the model's training data
    when ``cfg.task`` names none); the caller closes it."""
    return build_task(resolve_task_config(EvalConfig(model=str(model), task=cfg.task)).task)
