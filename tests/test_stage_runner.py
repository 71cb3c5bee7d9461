"""The study scripts' stage runner: commands recorded, stages timed, seconds summed across
invocations, a failed command stopping the study."""

from __future__ import annotations

import json
import sys
import time

import pytest

from es_llm.stage_runner import Runner, finished, stage_seconds


def test_stages_are_recorded_timed_and_summed_by_kind(tmp_path, capsys):
    run = Runner(tmp_path, "study")
    run([sys.executable, "-c", "pass"])
    with run.inline("eval", ["es-llm", "eval", "--out", "x"]):
        time.sleep(0.2)
    with run.inline("measure", "measure s-250"):
        pass
    # A second invocation (another Runner on the same folder) adds to the same ledger.
    with Runner(tmp_path, "study").inline("eval", ["es-llm", "eval", "--out", "y"]):
        time.sleep(0.1)
    assert (tmp_path / "commands.txt").read_text().splitlines() == [
        f"{sys.executable} -c pass", "es-llm eval --out x", "es-llm eval --out y"]
    rows = [json.loads(x) for x in (tmp_path / "stage_times.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["stage"]) for r in rows] == [
        (sys.executable, f"{sys.executable} -c pass"), ("eval", "es-llm eval --out x"),
        ("measure", "measure s-250"), ("eval", "es-llm eval --out y")]
    assert rows[1]["seconds"] >= 0.2 and rows[3]["seconds"] >= 0.1
    # A line a killed study cut short is left out; the rest still count.
    with open(tmp_path / "stage_times.jsonl", "a") as f:
        f.write('{"kind": "eval", "sec')
    secs = stage_seconds(tmp_path)
    assert secs["eval"] == pytest.approx(rows[1]["seconds"] + rows[3]["seconds"], abs=0.1)
    assert secs["total"] == pytest.approx(sum(r["seconds"] for r in rows), abs=0.1)
    assert "[study] done in" in capsys.readouterr().out


def test_an_es_llm_command_is_timed_under_its_subcommand_and_a_failure_stops(tmp_path):
    run = Runner(tmp_path, "study")
    with pytest.raises(SystemExit, match="failed with status 3"):
        run([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert not (tmp_path / "stage_times.jsonl").exists()
    assert stage_seconds(tmp_path) == {}
    run([sys.executable, "-m", "es_llm", "eval", "--help"])
    row = json.loads((tmp_path / "stage_times.jsonl").read_text())
    assert row["kind"] == "eval"


def test_a_run_is_finished_with_its_final_checkpoint_and_enough_logged_steps(tmp_path):
    assert not finished(tmp_path)
    (tmp_path / "checkpoints" / "final").mkdir(parents=True)
    (tmp_path / "checkpoints" / "final" / "config.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"st')
    assert finished(tmp_path) and finished(tmp_path, 2) and not finished(tmp_path, 3)
