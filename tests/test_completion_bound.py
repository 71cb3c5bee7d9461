"""task.max_completion_chars: a completion beyond it scores 0 unread, as before, but now the
bound is a setting, every such completion is counted in the metrics, and the run says so
once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from es_llm.cli import main
from es_llm.errors import BadInput
from es_llm.tasks import Problem, TaskConfig, build_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, problem, answer", [
    ("countdown", Problem("c", "", {"numbers": [3, 5], "target": 8}), "<answer>3+5</answer>"),
    ("arithmetic", Problem("a", "", 8), "<answer>8</answer>")])
def test_the_bound_is_a_setting_and_a_cut_completion_is_flagged(name, problem, answer):
    padded = " " * 40 + answer
    short = build_task(TaskConfig(name=name, max_completion_chars=len(padded) - 1))
    long = build_task(TaskConfig(name=name, max_completion_chars=len(padded)))
    cut = short.score(problem, padded)
    assert cut.reward == 0 and cut.too_long and cut.details()["too_long"]
    kept = long.score(problem, padded)
    assert kept.correct and not kept.too_long
    with pytest.raises(BadInput, match="task.max_completion_chars must be a positive integer"):
        TaskConfig(name=name, max_completion_chars=0)


def notices(text: str) -> int:
    return text.count("longer than task.max_completion_chars=")


def test_eval_counts_the_cut_completions_and_says_so_once(ci_testbed, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(ci_testbed), "--backend", "hf", "--n", "2", "--limit",
                 "5", "--out", str(out), "--no-progress", "task.max_completion_chars=1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    cut = sum(r["too_long"] for r in rows)
    assert metrics["too_long"] == cut and cut >= 9  # every non-empty completion
    assert notices(capsys.readouterr().out) == 1


@pytest.mark.parametrize("command, config, key", [
    ("grpo", "grpo_countdown_ci.yaml", "rollout/too_long"),
    ("es", "es_countdown_ci.yaml", "es/too_long")])
def test_training_counts_the_cut_completions_per_step_and_says_so_once(ci_testbed, tmp_path,
                                                                      capsys, command, config,
                                                                      key):
    out = tmp_path / command
    length = "steps=2" if command == "grpo" else "iterations=2"
    assert main([command, "--config", str(ROOT / "configs" / config), "--out", str(out),
                 "--no-progress", f"model={ci_testbed}", "backend=hf", length,
                 "task.max_completion_chars=1"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r[key] > 0 for r in rows)
    assert notices(capsys.readouterr().out) == 1
