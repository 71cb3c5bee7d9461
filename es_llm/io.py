"""Atomic file writes: a killed process never leaves a half-written file behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

# The sampler settings a masked-diffusion model folder carries (see es_llm/diffusion).
SAMPLING_FILE = "diffusion_sampling.json"


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def replace_dir_atomic(src: str | Path, dst: str | Path) -> None:
    """Move the finished directory ``src`` to ``dst``, replacing an older ``dst`` last."""
    src, dst = Path(src), Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.replace(dst, old)
        os.replace(src, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dst)


def complete_jsonl_rows(path: str | Path) -> list[dict]:
    """The rows of a JSONL log up to the first line a killed writer left cut short."""
    rows = []
    if not Path(path).is_file():
        return rows
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def save_hf_checkpoint(model, tokenizer, folder: str | Path, data_from: str | Path | None = None,
                       extra=None) -> None:
    """An HF ``save_pretrained`` folder (safetensors + tokenizer), loadable by transformers
    and vLLM, written under a temporary name and renamed into place. A testbed model's
    held-out ``data/`` folder travels with it (``data_from``: the base model folder), so
    ``es-llm eval`` of a checkpoint finds its held-out set. ``extra(tmp_folder)`` may add
    files (a trainer's optimizer state) before the rename."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    data = Path(data_from) / "data" if data_from is not None else None
    if data is not None and data.is_dir():
        shutil.copytree(data, tmp / "data")
    # A diffusion model's sampler settings travel too, so its checkpoints decode the same way.
    sampler = Path(data_from) / SAMPLING_FILE if data_from is not None else None
    if sampler is not None and sampler.is_file():
        shutil.copy2(sampler, tmp / SAMPLING_FILE)
    if extra is not None:
        extra(tmp)
    replace_dir_atomic(tmp, folder)
