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


def test_summary_rows_average_the_seeds_at_each_checkpoint_and_the_table_lists_each_seed():
    def point(steps, acc, diff):
        return {"steps": steps, "samples": steps * 10.0, "seconds": steps * 2.0,
                "stats": {"greedy": {"a": acc, "diff": diff, "ci95": [diff - 0.1, diff + 0.1]}}}

    # Seed 0 was continued to 4 steps; seed 1 stopped at 2.
    points = {"es": [[point(1, 0.2, 0.1), point(2, 0.4, 0.3), point(4, 0.6, 0.5)],
                     [point(1, 0.3, 0.2), point(2, 0.5, 0.4)]]}
    rows = budget.summarise(points)
    assert [r["steps"] for r in rows] == [1, 2, 4] and [r["seeds"] for r in rows] == [2, 2, 1]
    assert [r["greedy"] for r in rows] == pytest.approx([0.25, 0.45, 0.6])
    assert rows[1]["greedy_gain"] == [0.3, 0.4]
    header, table = budget.table(rows, {"greedy": 0.1, "passk": {}}, "base")
    assert header[5] == "greedy - base per seed [95% CI]"
    assert table[0] == ["base", "-", "0", "0", "10.0%", "-"]
    assert table[2] == ["es", "2", "20", "4", "45.0%", "+30.0 [+20.0, +40.0]; +40.0 [+30.0, +50.0]"]


@pytest.mark.parametrize("setting, message", [
    ("budget.n=-1", "budget.n must be >= 0"), ("budget.k=[1,8]", "must be between 1 and budget.n=4"),
    ("budget.backend=torch", "budget.backend must be null")])
def test_bad_budget_settings_are_refused(setting, message):
    from es_llm.compare.run import CompareConfig
    from es_llm.config import load_config

    with pytest.raises(BadInput, match=message):
        load_config(CompareConfig, overrides=[setting])


def perturbed_copy(model, dest, scale):
    """A copy of ``model`` with every weight matrix moved by seeded noise of ``scale``."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model, dest)
    weights = load_file(dest / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for name, w in weights.items():
        if w.ndim == 2:
            weights[name] = w + scale * torch.randn(w.shape, generator=gen)
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.mark.slow
def test_compare_reads_every_checkpoint_along_the_runs_against_the_reference(ci_testbed, tmp_path):
    """A run whose checkpoints are the base model (step 2) and a perturbed copy (final): each
    row of the report's budget table is that checkpoint's own greedy `es-llm eval`, placed by
    the run's samples and summed seconds, and its gain is the paired difference."""
    from es_llm.cli import main

    run = fake_run(tmp_path)
    import shutil

    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    shutil.copytree(ci_testbed, run / "checkpoints" / "step_2")
    perturbed_copy(ci_testbed, run / "checkpoints" / "final", 0.05)
    data = tmp_path / "problems.jsonl"
    lines = (ci_testbed / "data" / "countdown_eval.jsonl").read_text().splitlines()[:24]
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "cmp"
    assert main(["compare", "--models", f"base={ci_testbed}", "--task", "countdown", "--data",
                 str(data), "--n", "2", "--max-tokens", "48", "--backend", "hf",
                 "--budget-runs", f"es@0={run}", "budget.n=2", "budget.k=[1,2]",
                 "budget.stride=3", "--out", str(out), "--no-progress"]) == 0
    comp = json.loads((out / "comparison.json").read_text())
    study = comp["budget_study"]
    assert study["num_problems"] == 24 and study["num_sampled"] == 8 and study["k"] == [1, 2]
    reads = out / "samples" / "budget"

    def acc(folder):
        return json.loads((folder / "metrics.json").read_text())["pass@1"]["value"]

    base = acc(reads / "reference" / "greedy")
    assert study["base"]["greedy"] == pytest.approx(base)
    rows = {r["steps"]: r for r in study["rows"]}
    assert rows[2]["samples"] == 200.0 and rows[4]["seconds"] == pytest.approx(12.0)
    # The step-2 checkpoint is the base model: the same greedy texts, a gain of exactly 0.
    assert rows[2]["greedy"] == pytest.approx(base) and rows[2]["greedy_gain"] == [0.0]
    final = acc(reads / "es@0" / "step_4" / "greedy")
    assert rows[4]["greedy"] == pytest.approx(final)
    assert rows[4]["greedy_gain"][0] == pytest.approx(final - base)
    assert rows[4]["passk"]["1"] == pytest.approx(acc(reads / "es@0" / "step_4" / "sampled"))
    md = (out / "report.md").read_text()
    assert "## Accuracy against training budget" in md and "](figures/budget.png)" in md
    assert (out / "figures" / "budget.png").read_bytes()[:4] == b"\x89PNG"


def test_budget_runs_that_are_not_runs_are_refused_before_anything_is_written(ci_testbed, tmp_path,
                                                                               capsys):
    from es_llm.cli import main

    out = tmp_path / "cmp"
    assert main(["compare", "--models", f"base={ci_testbed}", "--budget-runs",
                 f"es@0={tmp_path}", "--out", str(out), "--no-progress"]) == 2
    assert "is not a finished training run" in capsys.readouterr().err
    assert not out.exists()
    assert main(["compare", "--models", f"base={ci_testbed}", "--budget-runs", "es@0",
                 "--out", str(out), "--no-progress"]) == 2
    assert "is not METHOD@SEED=RUN_DIR" in capsys.readouterr().err
