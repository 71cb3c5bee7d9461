"""Build the embedded testbed (see ``train.py`` for what the model is made of), cache it by
its fingerprint, report its pass@k, and copy it where the user asked.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from es_llm.backends.base import SamplingParams
from es_llm.config import dump_yaml, to_dict
from es_llm.errors import BadInput
from es_llm.io import replace_dir_atomic, write_json_atomic, write_jsonl_atomic, write_text_atomic
from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.tokenizer import build_tokenizer
from es_llm.testbed.train import held_out_sets, make_model, record, train


def cache_root() -> Path:
    return Path(os.environ.get("ES_LLM_CACHE", Path.home() / ".cache" / "es-llm")) / "testbed"


def _count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _report(model_dir: Path, cfg: TestbedConfig, progress: bool) -> dict:
    """pass@k of the fresh model on its held-out Countdown set (transformers backend)."""
    from es_llm.backends.hf import HFBackend
    from es_llm.evaluate import metrics_from_rows, sample_and_score
    from es_llm.tasks import TaskConfig, build_task

    r = cfg.report
    task = build_task(TaskConfig(name="countdown", data=str(model_dir / "data" / "countdown_eval.jsonl")))
    try:
        params = SamplingParams(n=r.samples, temperature=r.temperature, max_tokens=r.max_tokens,
                                seed=cfg.seed)
        rows = sample_and_score(HFBackend(str(model_dir)), task, task.problems(), params, progress)
    finally:
        task.close()
    m = metrics_from_rows(rows, r.samples, bootstrap=200)
    top = f"pass@{r.samples}"
    return {"samples": r.samples, "temperature": r.temperature,
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
    report = _report(tmp, cfg, progress)
    info = {"size": cfg.size, "fingerprint": cfg.fingerprint(), "parameters": _count_params(model),
            "train": stats, "build_s": round(train_s, 1),
            "held_out": {k: len(v) for k, v in sets.items()}, "report": report,
            "config": to_dict(cfg)}
    write_text_atomic(tmp / "testbed.yaml", dump_yaml(cfg))
    write_json_atomic(tmp / "testbed.json", info)
    return info


def check_out_dir(out: Path) -> None:
    """Refuse an --out that replacing would destroy: a file, or a folder that is neither empty
    nor an earlier testbed build."""
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {str(out)!r} exists and is not a directory; give a new path or "
                       f"an earlier testbed folder to replace.")
    if out.is_dir() and any(out.iterdir()) and not (out / "testbed.json").is_file():
        raise BadInput(f"--out {str(out)!r} is a non-empty folder that is not a testbed build; "
                       f"it would be replaced, so give a new or empty path instead.")


def build_testbed(cfg: TestbedConfig, out: str | Path | None = None, progress: bool = True,
                  echo=print) -> tuple[Path, dict]:
    """Build (or reuse from the cache) the testbed for ``cfg``; copy it to ``out`` if given.

    Returns the model folder and its ``testbed.json`` contents.
    """
    if out is not None:
        check_out_dir(Path(out))
    cached = cache_root() / f"{cfg.size}-{cfg.fingerprint()}"
    if (cached / "testbed.json").is_file():
        echo(f"testbed {cfg.size} found in cache: {cached}")
    else:
        echo(f"building testbed {cfg.size} (fingerprint {cfg.fingerprint()})")
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{cached.name}."))
        try:
            _build_into(tmp, cfg, progress, echo)
            replace_dir_atomic(tmp, cached)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    info = json.loads((cached / "testbed.json").read_text())
    target = cached
    if out is not None and Path(out).resolve() != cached.resolve():
        target = Path(out)
        target.resolve().parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.resolve().parent, prefix=f".{target.name}."))
        try:
            shutil.copytree(cached, staging, dirs_exist_ok=True)
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
             f"  held-out countdown: pass@1 {r['pass@1']:.3f}  {top} {r[top]:.3f} "
             f"(n={r['samples']}, T={r['temperature']})"]
    for tier, m in sorted(r.get("by_difficulty", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"    tier {tier}: pass@1 {m['pass@1']:.3f}  pass@{r['samples']} "
                     f"{m['pass@n']:.3f}  ({m['num_problems']} problems)")
    return "\n".join(lines)
