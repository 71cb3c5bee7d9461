"""Running a study's stages as plain `es-llm` commands (``scripts/experiment.py``,
``scripts/scaling_study.py``): each command is printed and appended to the study folder's
``commands.txt`` (rerunnable by hand), then run in a process of its own; a failure stops the
study with the command that failed. A stage the study runs in its own process instead
(``record``: the scaling study's builds and transformers evaluations) is recorded the same
way; what the study computes itself (its measurements and report) has no command."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from es_llm.io import complete_jsonl_rows


def es_llm_command(kind: str, ranks: int = 1) -> list[str]:
    """The command prefix of ``es-llm <kind>`` in this interpreter; ES under ``mpirun -n
    ranks`` (the environment's own mpirun) when ranks > 1."""
    cmd = [sys.executable, "-m", "es_llm", kind]
    if kind == "es" and ranks > 1:
        mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
        cmd = [mpirun, "-n", str(ranks)] + cmd
    return cmd


def finished(run: Path, steps: int | None = None) -> bool:
    """``run`` holds a final checkpoint (after ``steps`` logged steps, when given): a
    training stage the study skips."""
    return ((run / "checkpoints" / "final" / "config.json").is_file()
            and (steps is None or len(complete_jsonl_rows(run / "metrics.jsonl")) >= steps))


class Runner:
    """Runs stage commands, echoing them under ``label`` and keeping OUT/commands.txt."""

    def __init__(self, out: Path, label: str):
        self.log, self.label = out / "commands.txt", label

    def record(self, cmd: list) -> list[str]:
        """Print and log ``cmd`` without running it: for a stage the caller runs in this
        process (what the command would do, without a new interpreter's start-up)."""
        cmd = [str(c) for c in cmd]
        line = " ".join(cmd)
        print(f"[{self.label}] {line}", flush=True)
        with open(self.log, "a") as f:
            f.write(line + "\n")
        return cmd

    def __call__(self, cmd: list) -> None:
        cmd = self.record(cmd)
        line = " ".join(cmd)
        t0 = time.time()
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise SystemExit(f"[{self.label}] failed with status {proc.returncode}: {line}")
        print(f"[{self.label}] done in {time.time() - t0:.0f} s", flush=True)
