"""Running a study's stages as plain `es-llm` commands (``scripts/experiment.py``,
``scripts/scaling_study.py``): each command is printed and appended to the study folder's
``commands.txt`` (rerunnable by hand), then run in a process of its own; a failure stops the
study with the command that failed. A stage the study runs in its own process instead
(``inline``: the scaling study's builds, measurements and transformers evaluations) is
recorded the same way, under its command when it has one. Every finished stage's seconds go
to ``stage_times.jsonl``, so a study's compute adds up across the invocations that ran it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
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
    """Runs stage commands, echoing them under ``label`` and keeping OUT/commands.txt and
    OUT/stage_times.jsonl."""

    def __init__(self, out: Path, label: str):
        self.log, self.times, self.label = out / "commands.txt", out / "stage_times.jsonl", label

    def record(self, cmd: list) -> list[str]:
        """Print and log ``cmd`` without running it."""
        cmd = [str(c) for c in cmd]
        line = " ".join(cmd)
        print(f"[{self.label}] {line}", flush=True)
        with open(self.log, "a") as f:
            f.write(line + "\n")
        return cmd

    @contextmanager
    def inline(self, kind: str, cmd: list | str):
        """Time a stage the caller runs in this process: what the command ``cmd`` would do
        without a new interpreter's start-up, or a computation with no command (``cmd`` a
        label, not recorded in commands.txt)."""
        stage = cmd if isinstance(cmd, str) else " ".join(self.record(cmd))
        t0 = time.time()
        yield
        self._finished(kind, stage, time.time() - t0)

    def __call__(self, cmd: list) -> None:
        cmd = self.record(cmd)
        line = " ".join(cmd)
        t0 = time.time()
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise SystemExit(f"[{self.label}] failed with status {proc.returncode}: {line}")
        self._finished(cmd[cmd.index("es_llm") + 1] if "es_llm" in cmd else cmd[0], line,
                       time.time() - t0)

    def _finished(self, kind: str, stage: str, seconds: float) -> None:
        print(f"[{self.label}] done in {seconds:.0f} s", flush=True)
        with open(self.times, "a") as f:
            f.write(json.dumps({"kind": kind, "stage": stage, "seconds": round(seconds, 2)})
                    + "\n")


def stage_seconds(out: Path) -> dict[str, float]:
    """Seconds of the finished stages in ``out``'s stage_times.jsonl by kind (``es``,
    ``eval``, ...) and in ``total``; empty when none is recorded."""
    totals: dict[str, float] = {}
    path = out / "stage_times.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line a killed study cut short: that stage reruns
            continue
        totals[row["kind"]] = totals.get(row["kind"], 0.0) + row["seconds"]
    return {**{k: round(v, 1) for k, v in sorted(totals.items())},
            **({"total": round(sum(totals.values()), 1)} if totals else {})}
