"""--out paths no command may accept, for the tests of every command and study script."""

from __future__ import annotations

from pathlib import Path

KINDS = ("file", "dangling link", "under /proc", "below a file")


def unusable_out(tmp_path: Path, kind: str) -> Path:
    """An --out of ``kind`` beside a file ``keep`` that must survive the refusal."""
    (tmp_path / "keep").write_text("keep me")
    if kind == "file":
        return tmp_path / "keep"
    if kind == "dangling link":
        (tmp_path / "link").symlink_to(tmp_path / "missing")
        return tmp_path / "link"
    if kind == "under /proc":
        return Path("/proc/es-llm-out")
    return tmp_path / "keep" / "sub"


def untouched(tmp_path: Path) -> bool:
    """Nothing was created and the file is as it was."""
    names = sorted(p.name for p in tmp_path.iterdir())
    return names in (["keep"], ["keep", "link"]) and (tmp_path / "keep").read_text() == "keep me"
