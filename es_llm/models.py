"""Model folders: what a folder must hold before a command loads it, and the data files a
testbed build (and every checkpoint trained from one, which copies them) ships beside its
weights: ``data/<task>_eval.jsonl`` (held out for evaluation) and ``data/<task>_rl.jsonl``
(training prompts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from es_llm.errors import BadInput


def check_model_path(path: str, what: str = "model") -> Path:
    """``path`` as a Path once it is known to load: a folder with a config.json that
    transformers parses, tokenizer files it loads and safetensors weights whose headers are
    whole (a truncated file fails here). Anything else is ``BadInput`` naming the folder, so
    a command stops before it has written or sampled anything."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer

    p = Path(path)
    if not path:
        raise BadInput(f"no {what} given; pass --model PATH (a Hugging Face model folder, e.g. "
                       f"one built by `es-llm testbed`).")
    if not p.is_dir() or not (p / "config.json").is_file():
        raise BadInput(f"{what} path {path!r} is not a Hugging Face model folder (expected a "
                       f"directory with config.json, weights and tokenizer files).")
    step = "config.json"
    try:
        AutoConfig.from_pretrained(p)
        step = "the tokenizer files"
        AutoTokenizer.from_pretrained(p)
        step = "the weights"
        weights = sorted(p.glob("*.safetensors"))
        if not weights:
            raise OSError("the folder has no *.safetensors file")
        for w in weights:
            with safe_open(w, framework="pt") as f:
                list(f.keys())
    except Exception as exc:  # noqa: BLE001 - any load failure is a folder the user must fix
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise BadInput(f"{what} folder {path!r} does not load: {step} failed ({detail}). "
                       f"Give a complete Hugging Face model folder (config.json, tokenizer "
                       f"files and *.safetensors weights), e.g. one built by `es-llm testbed` "
                       f"or a run's checkpoints/final.") from None
    return p


def _with_model_data(cfg, split: str):
    """``cfg`` (any config with ``model`` and ``task``) with the model's own
    ``data/<task>_<split>.jsonl`` as its task's data, when it names none and the folder has
    that file."""
    shipped = Path(cfg.model) / "data" / f"{cfg.task.name}_{split}.jsonl"
    if cfg.task.data is None and shipped.is_file():
        return replace(cfg, task=replace(cfg.task, data=str(shipped)))
    return cfg


def resolve_task_config(cfg):
    """Point a task without data at the model's own held-out set when it has one.

    Testbed builds ship ``data/<task>_eval.jsonl``; evaluating a testbed model (or a
    checkpoint trained from it, which copies the folder) on its task then uses the
    held-out problems it never saw in training, not freshly generated ones.
    """
    return _with_model_data(cfg, "eval")


def resolve_training_data(cfg):
    """A training config (any with ``model`` and ``task``) on a testbed model uses the model's
    held-out training prompts, ``data/<task>_rl.jsonl``, when it names no data file."""
    return _with_model_data(cfg, "rl")
