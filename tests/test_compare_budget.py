"""The budget study's maths: checkpoints placed by samples and seconds, paired gains, the
table; bad run folders refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from es_llm.compare import budget
from es_llm.errors import BadInput


def fake_run(tmp_path, key="perf/iter_s", steps=(2,)):
    run = tmp_path / "run"
    (run / "checkpoints" / "final").mkdir(parents=True)
    for k in steps:
        (run / "checkpoints" / f"step_{k}").mkdir()
    rows = [{"step": i, "samples/generated": 100.0 * (i + 1), key: 1.5 + i} for i in range(4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_checkpoints_are_placed_by_samples_and_summed_seconds(tmp_path):
    points = budget.budget_points(fake_run(tmp_path))
    assert [(p["steps"], p["samples"], p["seconds"]) for p in points] == [
        (2, 200.0, 1.5 + 2.5), (4, 400.0, 1.5 + 2.5 + 3.5 + 4.5)]
    assert points[-1]["checkpoint"].endswith("final")
    grpo = budget.budget_points(fake_run(tmp_path / "g", key="perf/step_s", steps=()))
    assert [p["steps"] for p in grpo] == [4]


def test_a_folder_that_is_not_a_finished_run_is_refused(tmp_path):
    with pytest.raises(BadInput, match="is not a finished training run"):
        budget.budget_points(tmp_path)
    run = fake_run(tmp_path, key="perf/other")
    with pytest.raises(BadInput, match="not an es-llm training log"):
        budget.budget_points(run)


def test_point_stats_by_hand():
    base_g = {"a": [False], "b": [False], "c": [True], "d": [False]}
    greedy = {"a": [True], "b": [False], "c": [True], "d": [True]}
    base_s = {"a": [True, False], "b": [False, False]}
    sampled = {"a": [True, True], "b": [True, False]}
    st = budget.point_stats(greedy, base_g, sampled, base_s, [1, 2], np.random.default_rng(0))
    assert st["greedy"]["a"] == 0.75 and st["greedy"]["b"] == 0.25
    assert st["greedy"]["diff"] == pytest.approx(0.5)
    # pass@1: (1 + 0.5) / 2 vs (0.5 + 0) / 2; pass@2: (1 + 1) / 2 vs (1 + 0) / 2.
    assert st["passk"]["1"]["a"] == pytest.approx(0.75) and st["passk"]["1"]["b"] == pytest.approx(0.25)
    assert st["passk"]["2"]["diff"] == pytest.approx(0.5)
    with pytest.raises(BadInput, match="no samples for 1 of the problems"):
        budget.point_stats({"a": [True]}, {"a": [True], "z": [False]}, None, None, [1],
                           np.random.default_rng(0))


def test_summary_rows_average_seeds_and_the_table_lists_each_seed():
    def point(steps, acc, diff):
        return {"steps": steps, "samples": steps * 10.0, "seconds": steps * 2.0,
                "stats": {"greedy": {"a": acc, "diff": diff, "ci95": [diff - 0.1, diff + 0.1]}}}

    points = {"es": [[point(1, 0.2, 0.1), point(2, 0.4, 0.3)],
                     [point(1, 0.3, 0.2), point(2, 0.5, 0.4)]]}
    rows = budget.summarise(points)
    assert [r["greedy"] for r in rows] == pytest.approx([0.25, 0.45])
    assert rows[1]["greedy_gain"] == [0.3, 0.4] and rows[1]["seeds"] == 2
    table = budget.table_markdown(rows, {"greedy": 0.1, "passk": {}})
    assert "| es | 2 | 20 | 4 | 45.0% | +30.0 [+20.0, +40.0]; +40.0 [+30.0, +50.0] |" in table
