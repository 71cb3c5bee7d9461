"""Where the 3-4-piece Syzygy endgame tables live, and how to install them.

The chess task's endgame tiers verify a move by probing Syzygy tablebases: the win/draw/loss
tables (``.rtbw``) and distance-to-zeroing tables (``.rtbz``) of every material set with
three or four pieces, 35 sets and 70 files (about 4.5 MB). python-chess ships exactly these
tables as test data in its source distribution (``data/syzygy/regular/``), not in its wheel,
so ``install`` fetches the source archive of the installed python-chess version with pip and
copies out only those files::

    python -m es_llm.tasks.chess_tables                 # into default_dir()
    python -m es_llm.tasks.chess_tables --dest DIR      # elsewhere (then set ES_LLM_SYZYGY)
    python -m es_llm.tasks.chess_tables --sdist chess-1.11.2.tar.gz   # offline

The folder is ``$ES_LLM_SYZYGY`` when set, else ``<sys.prefix>/share/es-llm/syzygy`` (inside
the virtual environment, so each environment carries its own copy).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import chess

from es_llm.errors import BadInput

ENV_VAR = "ES_LLM_SYZYGY"
# Where the tables sit inside python-chess's source archive, below its top-level folder.
ARCHIVE_FOLDER = ("data", "syzygy", "regular")
SUFFIXES = (".rtbw", ".rtbz")
# No table file of 3-4 pieces is near this size; a larger member is not a table.
MAX_TABLE_BYTES = 16 << 20


def table_names() -> list[str]:
    """The 35 Syzygy material sets with 3 or 4 pieces, e.g. ``KQvK``, ``KRPvK``, ``KQvKR``.

    Each side has a king plus at most two other pieces, four pieces in all; the stronger
    (or equal) side is written first, pieces in the order Q R B N P, as Syzygy names files.
    """
    order = "QRBNP"
    rank = {p: i for i, p in enumerate(order)}

    def strength(side: str) -> tuple:
        return (len(side), tuple(-rank[p] for p in side))

    names = set()
    for n_strong in (1, 2):
        for strong in itertools.combinations_with_replacement(order, n_strong):
            for n_weak in range(3 - n_strong):
                for weak in itertools.combinations_with_replacement(order, n_weak):
                    a, b = "".join(strong), "".join(weak)
                    if strength(b) > strength(a):
                        a, b = b, a
                    names.add(f"K{a}vK{b}")
    return sorted(names)


def expected_files() -> list[str]:
    """The 70 file names a complete folder holds (one WDL and one DTZ file per table)."""
    return [name + suffix for name in table_names() for suffix in SUFFIXES]


def default_dir() -> Path:
    """``$ES_LLM_SYZYGY`` if set, else ``<sys.prefix>/share/es-llm/syzygy``."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path(sys.prefix) / "share" / "es-llm" / "syzygy"


def missing_files(folder: Path) -> list[str]:
    """The expected table files that ``folder`` lacks (or holds empty)."""
    folder = Path(folder)
    return [name for name in expected_files()
            if not (folder / name).is_file() or (folder / name).stat().st_size == 0]


def find_tables() -> Path:
    """The folder of the installed tables; raises BadInput saying how to install them."""
    folder = default_dir()
    missing = missing_files(folder)
    if missing:
        where = (f"${ENV_VAR} = {str(folder)!r}" if os.environ.get(ENV_VAR)
                 else f"{str(folder)!r}")
        raise BadInput(
            f"the chess task's endgame tiers need the 3-4-piece Syzygy tablebases, but "
            f"{where} lacks {len(missing)} of their {len(expected_files())} files (e.g. "
            f"{missing[0]}). Install them with `python -m es_llm.tasks.chess_tables` (or "
            f"`bash scripts/setup.sh`), point ${ENV_VAR} at a folder that holds them, or use "
            f"only the mate tiers (task.tiers: [3, 4]), which need no tables.")
    return folder


def download_sdist(workdir: Path) -> Path:
    """Download the source archive of the installed python-chess into ``workdir`` with pip."""
    spec = f"chess=={chess.__version__}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", spec, "-d", str(workdir)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    archives = sorted(workdir.glob("chess-*.tar.gz"))
    if done.returncode != 0 or not archives:
        tail = " ".join((done.stderr or done.stdout).split())[-400:]
        raise BadInput(f"could not download the python-chess source archive ({spec}) with pip "
                       f"(exit status {done.returncode}: {tail}). Download "
                       f"chess-{chess.__version__}.tar.gz on a machine with network access "
                       f"and pass it with --sdist FILE.")
    return archives[0]


def _table_members(archive: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    """The archive's table files, by file name.

    Only regular files exactly at ``<top>/data/syzygy/regular/<expected name>`` qualify, and
    the output path is built from the validated name alone, so links, devices, absolute paths
    and ``..`` components in the archive can never write outside the destination.
    """
    wanted = set(expected_files())
    found = {}
    for member in archive.getmembers():
        parts = PurePosixPath(member.name).parts
        if (len(parts) == 5 and parts[1:4] == ARCHIVE_FOLDER and parts[4] in wanted
                and member.isfile() and 0 < member.size <= MAX_TABLE_BYTES):
            found[parts[4]] = member
    return found


def extract_tables(sdist: Path, dest: Path) -> None:
    """Copy the table files out of the source archive ``sdist`` into a new folder ``dest``."""
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            members = _table_members(archive)
            missing = sorted(set(expected_files()) - set(members))
            if missing:
                raise BadInput(f"{str(sdist)!r} lacks {len(missing)} Syzygy table files under "
                               f"<top>/{'/'.join(ARCHIVE_FOLDER)}/ (e.g. {missing[0]}); pass the "
                               f"python-chess source archive (chess-<version>.tar.gz).")
            dest.mkdir(parents=True)
            for name, member in sorted(members.items()):
                source = archive.extractfile(member)
                with source, open(dest / name, "wb") as out:
                    shutil.copyfileobj(source, out)
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise BadInput(f"{str(sdist)!r} could not be read as a .tar.gz archive "
                       f"({type(exc).__name__}: {exc}); pass the python-chess source "
                       f"archive (chess-<version>.tar.gz).") from exc


def install(dest: Path | str | None = None, sdist: Path | str | None = None) -> Path:
    """Install the 3-4-piece tables into ``dest`` (default ``default_dir()``); return it.

    Nothing happens when ``dest`` is already complete. Otherwise the files are extracted from
    ``sdist`` (downloaded with pip when not given) into a temporary folder beside ``dest``,
    which then becomes ``dest`` in one rename, so an interrupted install never leaves a
    half-filled folder that ``find_tables`` would accept. An existing ``dest`` (which may
    hold other tables, e.g. 5-piece ones) is never replaced: only its missing files are
    moved in, each in one rename.
    """
    dest = Path(dest).expanduser() if dest is not None else default_dir()
    missing = missing_files(dest)
    if not missing:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as work:
        work = Path(work)
        archive = Path(sdist).expanduser() if sdist is not None else download_sdist(work / "dl")
        staged = work / "tables"
        extract_tables(archive, staged)
        if not dest.is_dir():
            try:
                os.replace(staged, dest)
                return dest
            except OSError:
                if not dest.is_dir():  # not another install that finished first
                    raise
        for name in missing_files(dest):
            os.replace(staged / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m es_llm.tasks.chess_tables [--dest DIR] [--sdist FILE]``."""
    parser = argparse.ArgumentParser(
        prog="python -m es_llm.tasks.chess_tables",
        description="Install the 3-4-piece Syzygy endgame tables the chess task verifies "
                    "moves with, taken from the python-chess source archive.")
    parser.add_argument("--dest", type=Path, default=None,
                        help=f"folder to install into (default: ${ENV_VAR} if set, else "
                             f"<sys.prefix>/share/es-llm/syzygy; now {default_dir()})")
    parser.add_argument("--sdist", type=Path, default=None,
                        help="a downloaded chess-<version>.tar.gz to take the tables from "
                             "(default: download it with pip)")
    args = parser.parse_args(argv)
    try:
        dest = install(args.dest, args.sdist)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"Syzygy tables ({len(table_names())} material sets) are in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
