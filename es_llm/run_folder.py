"""The run folders of the training commands: where a new run may go, what ``--resume`` may
change, and errors that name the file a run could not write."""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import yaml

from es_llm.config import MACHINE_KEY, load_yaml_text, parse_override
from es_llm.errors import BadInput

# What a training run writes into its folder.
RUN_FILES = ("config.yaml", "metrics.jsonl", "ledger.jsonl")


def check_out_path(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as a Path, once it is shown that it can be a folder this process writes in:
    an existing file, a symbolic link to nothing, a path below a file and a place where
    nothing can be created (``/proc``, a read-only or immutable folder, a full disk) are
    refused up front, not after the work. Nothing is left behind by the proof."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise BadInput(f"{flag} {str(p)!r} is a symbolic link to {str(p.readlink())!r}, which "
                       f"does not exist; give a folder, or create the link's target first.")
    if p.exists() and not p.is_dir():
        raise BadInput(f"{flag} {str(p)!r} exists and is not a folder; give a new or existing "
                       f"folder.")
    parent = p.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"{flag} {str(p)!r} cannot be created: {str(parent)!r} is a file, not a "
                       f"folder; give a path under a folder.")
    _probe_writable(p, parent, flag)
    return p


def _probe_writable(p: Path, parent: Path, flag: str) -> None:
    """Create a folder and a file in ``parent`` (``p`` itself, or its nearest existing
    ancestor) and remove them again; BadInput naming the reason when that fails."""
    probe = None
    try:
        probe = Path(tempfile.mkdtemp(dir=parent, prefix=".es-llm-probe-"))
        (probe / "probe").write_bytes(b"0")
    except OSError as exc:
        where = "written in" if parent == p.absolute() else f"created in {str(parent)!r}"
        raise BadInput(f"{flag} {str(p)!r} cannot be {where} ({exc.strerror or exc}); give a "
                       f"folder this user can create and write.") from None
    finally:
        if probe is not None:
            shutil.rmtree(probe, ignore_errors=True)


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` already holds (part of) a training run."""
    checkpoints = folder / "checkpoints"
    return (any((folder / name).exists() for name in RUN_FILES)
            or (checkpoints.is_dir() and any(checkpoints.iterdir())))


def refuse_resume_changes(command: str, overrides: list[str], flags: dict,
                          allowed: tuple[str, ...], folder: Path) -> None:
    """``--resume`` continues a run with the settings it started with: any override but
    ``allowed`` (the run's length, checkpoint and logging cadence) would replay its history
    under other settings, so it is refused, naming the keys."""
    refused = sorted({".".join(parse_override(o)[0]) for o in overrides} - set(allowed))
    refused += [f"--{name}" for name in sorted(flags)]
    if refused:
        raise BadInput(
            f"--resume {str(folder)!r} continues a run with the settings it started with, so "
            f"{', '.join(refused)} cannot change (only {', '.join(allowed)} may). To train "
            f"with other settings, start a new run: es-llm {command} --config "
            f"{folder / 'config.yaml'} --out NEW_FOLDER {' '.join(overrides)}".rstrip() + ".")


def training_folder(args, what: str, command: str, allowed: tuple[str, ...],
                    flags: dict) -> tuple[Path, object]:
    """``(run folder, config file)`` of a training command: a new run in ``--out`` with
    ``--config``, or the run in ``--resume DIR`` with its own config.yaml, changed only in
    ``allowed`` keys. A folder that already holds a run is refused as ``--out``: starting
    over there would truncate its logs and leave its old checkpoints beside new ones."""
    if args.resume:
        out = check_out_path(args.resume, "--resume")
        if not (out / "config.yaml").is_file():
            raise BadInput(f"--resume {args.resume!r} is not {what} run folder (it needs the "
                           f"config.yaml that `es-llm {command}` writes).")
        if args.out and Path(args.out).resolve() != out.resolve():
            raise BadInput("--resume continues a run in its own folder; drop --out or give "
                           "the same folder.")
        if args.config:
            raise BadInput(f"--resume uses the run's own {out / 'config.yaml'}; drop --config.")
        refuse_resume_changes(command, args.overrides, flags, allowed, out)
        return out, out / "config.yaml"
    if not args.out:
        if args.print_config:  # prints the config a run would use; it needs no folder
            return Path(), args.config
        raise BadInput(f"{command} needs --out DIR (a new run) or --resume DIR (continue one).")
    out = check_out_path(args.out)
    if out.is_dir() and holds_run(out):
        raise BadInput(f"--out {args.out!r} already holds {what} run; continue it with "
                       f"`es-llm {command} --resume {args.out}`, or give a new folder (or "
                       f"remove this one) to start over.")
    return out, args.config


def check_extends(folder: Path, key: str, value: int, done: int) -> None:
    """``--resume`` may run a run longer, not shorter than what it has already done."""
    if value < done:
        raise BadInput(f"--resume {str(folder)!r} has already done {done} {key}; {key}={value} "
                       f"would end it before that. Give {key}={done} or more.")


def other_machine(folder: Path) -> str | None:
    """A warning when the run in ``folder`` was started on another kind of machine than
    this one (its continuation is then reproducible only statistically), else None."""
    from es_llm.machine import machine_info, machine_kind

    try:
        recorded = load_yaml_text((folder / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    recorded = recorded.get(MACHINE_KEY) if isinstance(recorded, dict) else None
    if not isinstance(recorded, dict):
        return None
    before, now = machine_kind(recorded), machine_kind(machine_info())
    if before == now:
        return None
    return (f"es-llm: this run started on {before} and continues on {now}; results are "
            f"bitwise reproducible only on one machine type, so the continuation may differ "
            f"from what the first machine would have computed.")


def write_failed(path: Path, exc: OSError, resume: str) -> BadInput:
    """The error for a run that could not write ``path``: which file, why, and that
    ``resume`` (the command that continues the run) picks it up again."""
    why = exc.strerror or str(exc)
    return BadInput(f"could not write {str(path)!r} ({why}); the run stopped there. Everything "
                    f"it finished is kept: once the folder is writable again, `{resume}` "
                    f"continues it.")


@contextmanager
def written(path: Path, resume: str):
    """Turn an ``OSError`` of the writes inside into ``write_failed`` for ``path``."""
    try:
        yield
    except OSError as exc:
        raise write_failed(path, exc, resume) from None


class AppendLog:
    """A JSON-lines log opened for appending whose write errors name the file."""

    def __init__(self, path: Path, resume: str):
        self.path, self.resume = path, resume
        try:
            self._file = open(path, "a")
        except OSError as exc:
            raise write_failed(path, exc, resume) from None

    def write(self, line: str) -> None:
        try:
            self._file.write(line)
            self._file.flush()
        except OSError as exc:
            raise write_failed(self.path, exc, self.resume) from None

    def write_row(self, row: dict) -> None:
        """One JSON line of ``row``, any NaN or inf written as null and named under
        ``nonfinite`` (``finite.finite_row``): a bare NaN is not JSON."""
        from es_llm.finite import finite_row

        self.write(json.dumps(finite_row(row), allow_nan=False) + "\n")

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass


def recorded_machine(folder: Path) -> dict | None:
    """The machine a folder's result was computed on, as it recorded it: a run or eval
    folder's config.yaml ``machine`` section, or a testbed build's testbed.json."""
    try:
        if (folder / "config.yaml").is_file():
            data = load_yaml_text((folder / "config.yaml").read_text(encoding="utf-8"))
        elif (folder / "testbed.json").is_file():
            data = json.loads((folder / "testbed.json").read_text(encoding="utf-8"))
        else:
            return None
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return None
    machine = data.get(MACHINE_KEY) if isinstance(data, dict) else None
    return machine if isinstance(machine, dict) else None
