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


def current_umask() -> int:
    """The process's umask, read without changing it (``os.umask`` can only set it, which
    would race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shared_mode(path: str | Path, directory: bool = False) -> None:
    """Give ``path`` the permissions a plain ``open`` or ``mkdir`` would have given it.
    ``mkstemp`` and ``mkdtemp`` create private (0600 / 0700) entries; a result renamed into
    place from one would stay unreadable to others on a shared machine whatever the umask."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def share_tree(folder: str | Path) -> None:
    """``shared_mode`` for ``folder`` and everything in it (libraries such as
    ``save_pretrained`` also write their files through private temporary files)."""
    folder = Path(folder)
    shared_mode(folder, directory=True)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            shared_mode(path, directory=path.is_dir())


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A new folder under ``parent`` for staging a result, with umask permissions."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    shared_mode(tmp, directory=True)
    return tmp


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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


def jsonl_lines(path: str | Path, what: str) -> list[tuple[int, str, object]]:
    """``(line number, line, parsed value or None)`` for every non-blank line of a JSONL file
    that users give (its values are checked by the caller); BadInput naming ``what`` when
    the file cannot be read as UTF-8 text."""
    from es_llm.errors import BadInput

    # A device or a pipe would be read forever (/dev/zero) or block (a FIFO).
    if not Path(path).is_file():
        raise BadInput(f"{what} {str(path)!r} is not a regular file"
                       + (" (it does not exist)" if not Path(path).exists() else "")
                       + "; give a JSONL file.")
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {what} {str(path)!r} as UTF-8 text (JSONL): "
                       f"{exc.__class__.__name__}.") from None
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = None
        out.append((n, line, value))
    return out


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
                       extra=None, state_dict: dict | None = None) -> None:
    """An HF ``save_pretrained`` folder (safetensors + tokenizer), loadable by transformers
    and vLLM, written under a temporary name and renamed into place. A testbed model's
    held-out ``data/`` folder travels with it (``data_from``: the base model folder), so
    ``es-llm eval`` of a checkpoint finds its held-out set. ``extra(tmp_folder)`` may add
    files (a trainer's optimizer state) before the rename. ``state_dict`` (HF names) is
    saved instead of the model's own tensors (a LoRA trainer's merged weights)."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    data = Path(data_from) / "data" if data_from is not None else None
    if data is not None and data.is_dir():
        shutil.copytree(data, tmp / "data")
    # A diffusion model's sampler settings travel too, so its checkpoints decode the same
    # way, and a multi-role model's roles, so the test-time methods still find them.
    for name in (SAMPLING_FILE, "roles.json"):
        source = Path(data_from) / name if data_from is not None else None
        if source is not None and source.is_file():
            shutil.copy2(source, tmp / name)
    if extra is not None:
        extra(tmp)
    share_tree(tmp)
    replace_dir_atomic(tmp, folder)
