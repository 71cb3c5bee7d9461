"""Read problem records from local .jsonl / .json / .parquet files.

Files are read with the ``datasets`` library in offline mode (local files only, never the
Hub). Where ``datasets`` fails or would change values (JSON fields whose type varies between
records), the standard library (JSON) or pyarrow (parquet) reads the file instead. With a
``limit``, only the records it keeps are read: the first lines of a JSON Lines file, the
first row batches of a parquet file. The Arrow copy ``datasets`` makes of a file goes to a
temporary folder that is removed after reading, not to the user's cache, unless
``HF_DATASETS_CACHE`` names a cache to use. Every failure a user can fix (missing file,
unreadable file, records without a field the task needs) becomes a ``BadInput`` whose
message names the file, the missing field and the fields the file does have.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

from es_llm.errors import BadInput

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_records(
    path: str | os.PathLike,
    required: Mapping[str, tuple[str, ...]] | None = None,
    limit: int | None = None,
) -> list[dict]:
    """The records of a local data file, each a dict, with required fields resolved.

    ``required`` maps a canonical name to the field names that may supply it, in order of
    preference (e.g. ``{"prompt": ("prompt", "context")}``). Each returned record keeps all
    its own fields and gains the canonical name, set from the first alternative present with
    a non-null value. ``limit`` keeps only the first N records.

    Raises BadInput for a missing or unreadable file or a record lacking a required field.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise BadInput(f"data file {str(path)!r} does not exist (or is not a file); pass the path "
                       f"of a local {', '.join(FORMATS)} file.")
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise BadInput(f"data file {str(path)!r} has an unsupported extension "
                       f"{path.suffix!r}; use one of {', '.join(FORMATS)}.")
    records = _read(path, fmt, limit)
    if limit is not None:
        records = records[:limit]
    return [_resolve(rec, i, path, required or {}) for i, rec in enumerate(records)]


def _read(path: Path, fmt: str, limit: int | None) -> list[dict]:
    if limit is not None:
        return _read_parquet_pyarrow(path, limit) if fmt == "parquet" else \
            _read_json_stdlib(path, limit)
    try:
        records = _read_with_datasets(path, fmt)
    except Exception:  # noqa: BLE001 - any library failure is retried below
        # `datasets` can fail where a plain reader would not: it infers one Arrow type per
        # column, and it needs a writable cache directory. Retry without it; a file that
        # still fails is reported as BadInput.
        records = None
    if records is not None:
        return records
    return _read_parquet_pyarrow(path) if fmt == "parquet" else _read_json_stdlib(path)


def _read_parquet_pyarrow(path: Path, limit: int | None = None) -> list[dict]:
    try:
        import pyarrow.parquet as pq

        if limit is None:
            return pq.read_table(path).to_pylist()
        rows: list[dict] = []
        for batch in pq.ParquetFile(path).iter_batches(batch_size=max(1, min(limit, 65536))):
            rows += batch.to_pylist()
            if len(rows) >= limit:
                break
        return rows[:limit]
    except Exception as exc:  # noqa: BLE001 - whatever pyarrow raises, the file is unusable
        raise BadInput(f"data file {str(path)!r} could not be read as parquet: "
                       f"{_short(exc)}") from exc


def _read_with_datasets(path: Path, fmt: str) -> list[dict] | None:
    # Offline mode must be set before `datasets` is first imported; local files never need
    # the Hub, and a stray network attempt on an offline machine would only add a long wait.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets
    from datasets.utils import logging as ds_logging

    bars_were_off = datasets.are_progress_bars_disabled()
    verbosity = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    # Its own error log of a failed read would duplicate the BadInput (or the fallback).
    ds_logging.set_verbosity(ds_logging.CRITICAL)
    scratch = None if os.environ.get("HF_DATASETS_CACHE") else \
        tempfile.mkdtemp(prefix="es-llm-datasets-")
    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train", cache_dir=scratch)
        # A JSON field whose type changes between records becomes a `Json` column, which
        # decodes strings that look like JSON ("5" comes back as 5, "025" would too): values
        # must arrive as written, so such files go to the standard-library reader instead.
        json_feature = getattr(datasets, "Json", None)
        if json_feature is not None and any(isinstance(f, json_feature)
                                            for f in ds.features.values()):
            return None
        return ds.to_list()
    finally:
        # Restore the library's settings: reading a file must not change how others log.
        ds_logging.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _json_lines(path: Path, limit: int | None):
    """The records of a JSON Lines file in order, reading no further than ``limit`` of
    them."""
    count = 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if limit is not None and count >= limit:
                return
            if line.strip():
                count += 1
                yield _decode(path, line, f"line {n}")


def _read_json_stdlib(path: Path, limit: int | None = None) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            array = f.read(4096).lstrip().startswith("[")
        if array:
            records = _decode(path, path.read_text(encoding="utf-8"), "the JSON array")
            records = records[:limit] if isinstance(records, list) else records
        else:
            records = list(_json_lines(path, limit))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"data file {str(path)!r} could not be read: {_short(exc)}") from exc
    bad = next((i for i, r in enumerate(records) if not isinstance(r, dict)), None)
    if bad is not None:
        raise BadInput(f"data file {str(path)!r}: record {bad} is not a JSON object; every "
                       f"record must be an object with named fields.")
    return records


def _decode(path: Path, text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"data file {str(path)!r} is not valid JSON / JSON Lines ({where}): "
                       f"{_short(exc)}") from exc


def _resolve(rec: dict, index: int, path: Path, required: Mapping[str, tuple[str, ...]]) -> dict:
    out = dict(rec)
    missing = []
    for name, alternatives in required.items():
        value = next((rec[a] for a in alternatives if rec.get(a) is not None), None)
        if value is None:
            missing.append(name if alternatives == (name,) else
                           f"{name} (as any of {', '.join(alternatives)})")
        else:
            out[name] = value
    if missing:
        have = sorted(k for k, v in rec.items() if v is not None)
        raise BadInput(f"data file {str(path)!r}: record {index} lacks required field(s) "
                       f"{'; '.join(missing)}; the record has fields {', '.join(have) or 'none'}.")
    return out


def _short(exc: BaseException, limit: int = 300) -> str:
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return msg if len(msg) <= limit else msg[:limit] + "..."


def record_id(rec: dict, index: int) -> str:
    """A problem id from the record's ``id`` / ``unique_id`` / ``idx``, else its index."""
    for key in ("id", "unique_id", "idx"):
        if rec.get(key) is not None:
            return str(rec[key])
    return str(index)


def row_messages(rec: dict, path, index: int) -> tuple[dict, ...] | None:
    """The record's ``messages`` (a chat to render in place of its prompt when the task's
    chat template is on) as ``{"role", "content", ...}`` dicts, or None without the field.

    Fields a file reader filled with null for messages that lack them are dropped. Raises
    BadInput unless every message is a mapping with string ``role`` and ``content``."""
    messages = rec.get("messages")
    if messages is None:
        return None
    if isinstance(messages, (list, tuple)) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        return tuple({k: v for k, v in m.items() if v is not None} for m in messages)
    raise BadInput(f"data file {str(path)!r}: record {index} has messages "
                   f"{str(messages)[:80]!r}; messages must be a non-empty list of "
                   f"{{\"role\": ..., \"content\": ...}} objects with string values.")
