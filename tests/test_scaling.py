"""The pretraining-to-post-training study: the straight-line fits by hand, the per-problem
change by base difficulty by hand, the held-out loss against the model's own loss, the ci
grid end to end (its report equals its JSON), and bad grids."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from unusable_outs import KINDS, unusable_out, untouched

from es_llm.compare.scaling import (analyze, difficulty_change, post_training_gain, run_slope,
                                    shared_batch_correlation)
from es_llm.errors import BadInput
from es_llm.metrics.fits import curve_slope, line_band, linear_fit
from es_llm.studies import ScalingConfig

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "configs" / "scaling_countdown_ci.yaml"


def test_linear_fit_by_hand():
    # x = 1..4, y = 2, 4, 5, 8: x_mean 2.5, Sxx 5, Sxy 9.5 -> slope 1.9, intercept 0;
    # residuals 0.1, 0.2, -0.7, 0.4: SSE 0.70, s^2 0.35; SST 18.75; t(0.975, 2) = 4.302653.
    f = linear_fit([1, 2, 3, 4], [2, 4, 5, 8])
    t, s = 4.302653, math.sqrt(0.35)
    assert f["slope"] == pytest.approx(1.9) and f["intercept"] == pytest.approx(0.0, abs=1e-12)
    assert f["t"] == pytest.approx(t, abs=1e-6)
    assert f["slope_ci"] == pytest.approx([1.9 - t * s / math.sqrt(5), 1.9 + t * s / math.sqrt(5)])
    half = t * math.sqrt(0.35 * (1 / 4 + 2.5 ** 2 / 5))
    assert f["intercept_ci"] == pytest.approx([-half, half])
    assert f["r2"] == pytest.approx(1 - 0.70 / 18.75)
    lo, hi = line_band(f, [2.5, 1.0])
    assert lo[0] == pytest.approx(4.75 - t * s * 0.5) and hi[0] == pytest.approx(4.75 + t * s * 0.5)
    assert hi[1] - lo[1] > hi[0] - lo[0]  # the band widens away from the mean
    assert curve_slope([0, 1, 2], [1, 3, 5]) == pytest.approx(2.0)
    assert run_slope({"samples": [0, 500, 1000], "reward": [0.1, 0.2, 0.3]}) == pytest.approx(0.2)
    assert curve_slope([0, 2], [1, 0]) == pytest.approx(-0.5)
    for bad in (([1, 2], [1, 2]), ([1, 1, 1], [1, 2, 3]), ([1, 2, 3], [1, 2])):
        with pytest.raises(ValueError):
            linear_fit(*bad)


def test_a_constant_y_fits_exactly_with_zero_width_intervals():
    f = linear_fit([1, 2, 3, 4], [0.5] * 4)
    assert (f["slope"], f["intercept"], f["r2"], f["residual_sd"]) == (0.0, 0.5, None, 0.0)
    assert f["slope_ci"] == [0.0, 0.0] and f["intercept_ci"] == [0.5, 0.5]
    lo, hi = line_band(f, [0.0, 9.0])
    assert lo.tolist() == hi.tolist() == [0.5, 0.5]


def _cell(logp, base, grpo, es, n=4, loss=1.0, tokens=1e6, name="c"):
    models = {"base": {"n": n, "pass@1": sum(base) / n / len(base), "pass@k": 0.0,
                       "correct_P": base}}
    models["grpo@0"] = {"n": n, "pass@1": sum(grpo) / n / len(grpo), "pass@k": 0.0,
                        "correct_P": grpo}
    models["es@0"] = {"n": n, "pass@1": sum(es) / n / len(es), "pass@k": 0.0, "correct_P": es}
    return {"cell": name, "size": "s", "parameters": 1, "steps": 1, "tokens": tokens,
            "heldout_loss": loss, "reference_logp": logp, "models": models,
            "curves": {"grpo@0": {"samples": [0, 1000], "reward": [0.0, 0.1]},
                       "es@0": {"samples": [0, 1000], "reward": [0.0, 0.0]}}}


def test_change_by_base_difficulty_by_hand():
    ln10 = math.log(10)
    # Four problems: p = 1e-6 and 1e-5 (bin 0), 1e-3 (bin 1), 0.9 (bin 3); n = 4 samples.
    logp = [-6 * ln10, -5 * ln10, -3 * ln10, math.log(0.9)]
    cell = _cell(logp, base=[0, 0, 1, 3], grpo=[2, 0, 1, 4], es=[0, 1, 1, 3])
    d = difficulty_change([cell], np.random.default_rng(0), 100)
    assert d["pairs"] == [2, 1, 0, 1]
    g0 = d["grpo"][0]
    # Bin 0: base 0, 0; GRPO 2/4, 0: change (0.5 + 0) / 2; one of two never-solved solved.
    assert (g0["base"], g0["after"], g0["change"]) == (0.0, 0.25, 0.25)
    assert (g0["never_solved"], g0["newly_solved"]) == (2, 0.5)
    assert d["grpo"][2] is None and d["grpo"][3]["change"] == pytest.approx(0.25)
    assert d["es"][0]["newly_solved"] == 0.5 and d["es"][3]["change"] == 0.0
    assert d["es"][3]["never_solved"] == 0 and d["es"][3]["newly_solved"] is None
    # Without a redraw the base's own zero-hit pairs, and no base share.
    assert d["null"] is None and g0["beyond_base"] is None and g0["base_solved"] is None
    # A redraw that solved problem 0 and 3 but not 1 or 2: never solved now means problems 1
    # (bin 0) and 2 (bin 1). Bin 0: GRPO 0/4 on problem 1, ES 1/4, the base 0/4: GRPO 0 and
    # ES 1 of 1, beyond the base 0 and +1. Bin 1: the base solved problem 2 (1/4), GRPO
    # and ES too: shares 1, 1, beyond 0.
    cell["models"]["redraw"] = {"n": 4, "pass@1": 0.0, "pass@k": 0.0, "correct_P": [1, 0, 0, 2]}
    d = difficulty_change([cell], np.random.default_rng(0), 100)
    assert d["null"] == "redraw"
    g0, e0, g1 = d["grpo"][0], d["es"][0], d["grpo"][1]
    assert (g0["never_solved"], g0["newly_solved"], g0["base_solved"], g0["beyond_base"]) == (
        1, 0.0, 0.0, 0.0)
    assert (e0["newly_solved"], e0["beyond_base"], e0["beyond_base_ci"]) == (1.0, 1.0, [1.0, 1.0])
    assert (g1["never_solved"], g1["newly_solved"], g1["base_solved"], g1["beyond_base"]) == (
        1, 1.0, 1.0, 0.0)
    assert g0["change"] == 0.25  # the change is still over every pair of the bin
    # A second GRPO seed that solves problem 1 where seed 0 did not: accuracy is the seeds'
    # mean and "solves" the share of seeds with a hit (1/2), so two seeds get no more tries
    # than one.
    cell["models"]["grpo@1"] = {"n": 4, "pass@1": 0.0, "pass@k": 0.0, "correct_P": [0, 2, 0, 0]}
    g0 = difficulty_change([cell], np.random.default_rng(0), 100)["grpo"][0]
    assert (g0["after"], g0["newly_solved"], g0["beyond_base"]) == (0.25, 0.5, 0.5)


def test_analysis_fits_across_builds():
    # Three builds: loss 1.0, 0.8, 0.5; GRPO correct 1, 2, 4 of n = 4 (pass@1 0.25, 0.5, 1.0),
    # ES 1, 1, 2 of 4; GRPO's reward rises 0.1, 0.2, 0.4 per 1,000 samples at 1, 2, 4 M tokens.
    cells = []
    for i, (loss, tokens, g, e) in enumerate([(1.0, 1e6, 1, 1), (0.8, 2e6, 2, 1),
                                              (0.5, 4e6, 4, 2)]):
        c = _cell([0.0], [1], [g], [e], loss=loss, tokens=tokens, name=f"c{i}")
        c["curves"]["grpo@0"]["reward"] = [0.0, 0.1 * tokens / 1e6]
        cells.append(c)
    r = analyze(cells, np.random.default_rng(0), 50)
    assert [b["grpo_pass@1"] for b in r["builds"]] == [0.25, 0.5, 1.0]
    # Accuracy on loss, by hand: x 1.0, 0.8, 0.5 (mean 23/30), y 0.25, 0.5, 1.0 (mean 7/12);
    # Sxx = 0.38/3, Sxy = -0.575/3 -> slope -0.575 / 0.38.
    assert r["accuracy_vs_loss"]["grpo"]["slope"] == pytest.approx(-0.575 / 0.38)
    assert r["accuracy_vs_loss"]["grpo"]["slope_ci"][1] < 0
    assert r["accuracy_vs_loss"]["es"]["slope"] < 0
    # Reward slope (per 1,000 samples) on tokens (in millions): exactly 0.1 per million.
    assert r["builds"][2]["grpo_slope"] == pytest.approx(0.4)
    assert r["slope_vs_tokens"]["grpo"]["slope"] == pytest.approx(0.1)
    # Held-out gain per 1,000 samples: (0.25, 0.5, 1.0) - 0.25 over 1,000 samples, at 1, 2, 4
    # M tokens: x mean 7/3, Sxx 14/3, Sxy 7/6 -> 0.25 per million tokens.
    assert [b["grpo_gain"] for b in r["builds"]] == pytest.approx([0.0, 0.25, 0.75])
    assert r["gain_vs_tokens"]["grpo"]["slope"] == pytest.approx(0.25)
    assert r["shared_batches"]["grpo"] is None  # two-step curves: no correlation


def test_post_training_gain_is_the_seeds_mean_against_the_base_by_hand():
    # n = 4 on three problems: base 0, 1, 2 correct; GRPO seed 0 1, 1, 4 and seed 1 3, 1, 2:
    # seeds' mean 2, 1, 3 -> per-problem gains +50, 0, +25 points, mean +25.
    cell = _cell([0.0] * 3, base=[0, 1, 2], grpo=[1, 1, 4], es=[0, 1, 2])
    cell["models"]["grpo@1"] = {"n": 4, "pass@1": 0.5, "pass@k": 0.0, "correct_P": [3, 1, 2]}
    g = post_training_gain(cell, "grpo", np.random.default_rng(0), 200)
    assert (g["gain_points"], g["seeds"], g["problems"]) == (pytest.approx(25.0), 2, 3)
    assert 0 <= g["ci95"][0] <= 25 <= g["ci95"][1] <= 50
    # ES changes nothing: a zero gain with a zero-width interval.
    assert post_training_gain(cell, "es", np.random.default_rng(0), 200)["ci95"] == [0.0, 0.0]


def test_run_seeds_share_batches_only_when_asked():
    study = _script()
    from es_llm.config import load_config

    per_cell = load_config(ScalingConfig, path=CI_CONFIG)
    shared = load_config(ScalingConfig, path=CI_CONFIG, overrides=["batch_order=shared"])
    assert per_cell.batch_order == "per_cell"
    seeds = {(c, k): study.run_seed(per_cell, c, k) for c in per_cell.cells() for k in (0, 1)}
    assert len(set(seeds.values())) == len(seeds)  # every build and seed its own order
    assert all(0 <= v < 2**31 for v in seeds.values())
    assert study.run_seed(per_cell, "s-60", 0) == seeds[("s-60", 0)]  # a pure function
    assert [study.run_seed(shared, c, 1) for c in shared.cells()] == [1] * 4


def test_shared_batches_correlate_the_builds_curves_by_hand():
    # Seed 0: curves (0, 1, 0) and (0, 2, 1): deviations (-1/3, 2/3, -1/3) and (-1, 1, 0),
    # covariance 1, norms^2 2/3 and 2 -> r = sqrt(3)/2; a constant curve has none. Seed 1
    # has one build: no pair.
    cells = [_cell([0.0], [1], [1], [1], name=f"c{i}") for i in range(3)]
    for c, reward in zip(cells, ([0, 1, 0], [0, 2, 1], [1, 1, 1])):
        c["curves"]["es@0"] = {"samples": [0, 500, 1000], "reward": reward}
    cells[0]["curves"]["es@1"] = {"samples": [0, 500, 1000], "reward": [3, 1, 2]}
    got = shared_batch_correlation(cells, "es")
    assert got["mean"] == pytest.approx(math.sqrt(3) / 2) and got["pairs"] == 1


def test_held_out_loss_is_the_models_own_loss_on_the_same_examples(ci_testbed):
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.testbed.config import load_testbed_config
    from es_llm.testbed.scaling import heldout_loss, stream
    from es_llm.testbed.train import completion_batch

    model = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    draw = stream("countdown", load_testbed_config("ci"))
    loss, per_example = heldout_loss(model, tok, draw, 32, seed=5)
    rng = random.Random("5:held-out-stream")
    ids, labels = completion_batch([draw(rng) for _ in range(32)], tok)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long(),
                     labels=labels).loss
    assert loss == pytest.approx(float(want), rel=1e-5)
    assert per_example == pytest.approx(float((ids != tok.pad_token_id).sum()) / 32)


def _study(*args, timeout=1800):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "scaling_study.py"), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling") / "out"
    proc = _study("--config", CI_CONFIG, "--out", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_ci_grid_runs_end_to_end_and_its_report_equals_its_json(study):
    result = json.loads((study / "report" / "scaling.json").read_text())
    builds = result["builds"]
    assert [b["cell"] for b in builds] == ["s-60", "s-120", "m-60", "m-120"]
    assert builds[0]["parameters"] < builds[2]["parameters"]
    report = (study / "report" / "report.md").read_text()
    for b in builds:
        row = next(line for line in report.splitlines() if line.startswith(f"| {b['cell']} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{b['parameters']:,}" and cells[2] == str(b["steps"])
        assert cells[4] == f"{b['heldout_loss']:.4f}"
        for i, key in ((5, "base_pass@1"), (6, "grpo_pass@1"), (7, "es_pass@1")):
            assert cells[i] == f"{100 * b[key]:.1f}%"
        assert cells[11] == f"{b['grpo_slope']:+.4f}" and cells[14] == f"{b['es_gain']:+.4f}"
        # ES at ci size: 4 members x 4 prompts x 2 iterations = 32 samples.
        assert b["es_gain"] == pytest.approx(1000 * (b["es_pass@1"] - b["base_pass@1"]) / 32)
    # Each build's loss is its own study.json's; more training, lower held-out loss.
    for b in builds:
        study_json = json.loads((study / "builds" / b["cell"] / "study.json").read_text())
        assert study_json["heldout_loss"] == b["heldout_loss"]
    assert builds[1]["heldout_loss"] < builds[0]["heldout_loss"]
    fit = result["accuracy_vs_loss"]["base"]
    line = next(x for x in report.splitlines() if x.startswith("| base |"))
    assert f"{fit['slope']:+.3f}" in line
    assert (f"{fit['r2']:.2f}" if fit["r2"] is not None else "| - |") in line
    # Every stage's seconds, under its command's kind: the report's compute sums them.
    times = [json.loads(x) for x in (study / "stage_times.jsonl").read_text().splitlines()]
    commands = (study / "commands.txt").read_text().splitlines()
    assert [t["stage"] for t in times if t["kind"] != "measure"] == commands
    assert [t["kind"] for t in times].count("measure") == len(builds)
    assert {t["kind"] for t in times} == {"testbed", "measure", "sft", "grpo", "es", "eval"}
    total = result["stage_seconds"]["total"]
    assert total == pytest.approx(sum(t["seconds"] for t in times), abs=0.05 * 6)
    assert f"Compute: {total:,.0f} s of stages" in report
    # The chosen cell has the extra seed of the ci config (more_seeds: [1]); the others one.
    assert sorted(p.name for p in (study / "runs" / "m-120").iterdir()) == [
        "es-seed0", "es-seed1", "grpo-seed0", "grpo-seed1"]
    # Each build's runs trained on a seed of its own (batch_order: per_cell), so the builds
    # saw different prompt batches.
    study_script = _script()
    from es_llm.config import load_config, read_yaml
    used = {b["cell"]: read_yaml(study / "runs" / b["cell"] / "grpo-seed0"
                                 / "config.yaml")["seed"] for b in builds}
    ci = load_config(ScalingConfig, path=CI_CONFIG)
    assert used == {b["cell"]: study_script.run_seed(ci, b["cell"], 0) for b in builds}
    assert len(set(used.values())) == len(builds)
    for name in ("accuracy_vs_loss.png", "slope_vs_tokens.png", "difficulty.png"):
        assert (study / "report" / "figures" / name).stat().st_size > 5_000
    assert (study / "report" / "report.html").is_file()


@pytest.mark.slow
def test_rerunning_the_study_skips_every_finished_stage(study):
    before = (study / "commands.txt").read_text()
    times = (study / "stage_times.jsonl").read_text()
    proc = _study("--config", CI_CONFIG, "--out", study)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (study / "commands.txt").read_text() == before
    assert (study / "stage_times.jsonl").read_text() == times
    # A changed size would reuse builds made with the old one: refused, nothing run.
    report = (study / "report" / "scaling.json").read_bytes()
    proc = _study("--config", CI_CONFIG, "--out", study, "sizes.s.intermediate_size=96")
    assert proc.returncode == 2 and "was built with another testbed config" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    # So would other evaluation or training settings: the old evaluations under new names.
    for setting, named in (("eval.n=3", "other eval than"),
                           ("grpo.length=3", "other grpo than")):
        proc = _study("--config", CI_CONFIG, "--out", study, setting)
        assert proc.returncode == 2 and named in proc.stderr, proc.stderr
    assert (study / "commands.txt").read_text() == before
    assert (study / "report" / "scaling.json").read_bytes() == report


@pytest.mark.slow
def test_a_calibration_build_that_post_training_does_not_move_stops_the_study(study, tmp_path):
    # At ci size 2 GRPO steps move nothing. A copy of the finished study holding only the
    # calibration cell s-60 (its stages are reused): the study says so and stops before it
    # builds any other cell or writes a report.
    out = tmp_path / "out"
    shutil.copytree(study, out)
    for part in ("builds", "sft", "runs", "eval"):
        for cell in ("s-120", "m-60", "m-120"):
            shutil.rmtree(out / part / cell, ignore_errors=True)
    shutil.rmtree(out / "report")
    commands = (out / "commands.txt").read_text()
    proc = _study("--config", CI_CONFIG, "--out", out, "calibration.cell=s-60")
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    gain = json.loads((out / "calibration.json").read_text())
    assert gain["cell"] == "s-60" and gain["method"] == "grpo" and gain["ci95"][0] <= 0
    assert "shows no post-training gain" in proc.stderr and proc.stderr.count("\n") == 1
    assert f"{gain['gain_points']:+.1f} points" in proc.stderr
    assert (out / "commands.txt").read_text() == commands  # nothing ran, nothing built
    assert [p.name for p in (out / "builds").iterdir()] == ["s-60"]
    assert not (out / "report").exists()
    # The gain is the study's own numbers: GRPO's pass@1 on s-60 minus the base's.
    report = json.loads((study / "report" / "scaling.json").read_text())
    row = next(b for b in report["builds"] if b["cell"] == "s-60")
    assert gain["gain_points"] == pytest.approx(100 * (row["grpo_pass@1"] - row["base_pass@1"]))


@pytest.mark.parametrize("setting, message", [
    ("sizes={}", "the grid is empty"),
    ("pretrain_steps=[]", "the grid is empty"),
    ("pretrain_steps=[0,10]", "positive whole numbers"),
    ("sizes.s.hidden_size=0", "must be at least 1"),
    ("domain=arithmetic", "'arithmetic'"),
    ("more_seeds_for=[z-1]", "not cells of the grid"),
    ("eval_limit=0", "eval_limit must be a whole number"),
    ("calibration.cell=z-1", "calibration.cell names 'z-1'"),
    ("calibration.method=sft", "unknown calibration.method 'sft'"),
    ("batch_order=sorted", "unknown batch_order 'sorted'"),
])
def test_bad_grids_are_refused_before_anything_is_written(setting, message, tmp_path, capsys):
    study = _script()
    assert study.main(["--config", str(CI_CONFIG), "--out", str(tmp_path / "x"), setting]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_an_out_that_cannot_be_a_folder_is_refused(tmp_path, capsys, kind):
    study = _script()
    out = unusable_out(tmp_path, kind)
    assert study.main(["--config", str(CI_CONFIG), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(out)!r}" in err and err.count("\n") == 1, err
    assert untouched(tmp_path)


def test_a_grown_grid_reuses_stages_but_other_stage_settings_are_refused(tmp_path):
    study = _script()
    from es_llm.config import dump_yaml, load_config

    cfg = load_config(ScalingConfig, path=CI_CONFIG)
    (tmp_path / "scaling.yaml").write_text(dump_yaml(cfg))
    for grown in (["seeds=[0,3]"], ["pretrain_steps=[60,120,240]"], ["bootstrap=50"],
                  ["more_seeds_for=[s-60]"], ["calibration.cell=m-120"]):
        study.check_reused_stages(load_config(ScalingConfig, path=CI_CONFIG,
                                              overrides=grown), tmp_path)
    for changed, named in ((["eval_limit=3"], "eval_limit"), (["sft.lr=0.001"], "sft"),
                           (["es.overrides=[es.sigma=0.01]"], "es"),
                           (["heldout_examples=7", "eval.seed=1"], "heldout_examples, eval "),
                           (["batch_order=shared"], "batch_order")):
        with pytest.raises(BadInput, match=named):
            study.check_reused_stages(load_config(ScalingConfig, path=CI_CONFIG,
                                                  overrides=changed), tmp_path)


def _script():
    sys.path.insert(0, str(ROOT / "scripts"))
    import scaling_study
    return scaling_study


def test_the_chess_grid_loads_and_names_its_builds():
    from es_llm.config import load_config

    scaling_study = _script()
    cfg = load_config(ScalingConfig, path=ROOT / "configs" / "scaling_chess.yaml")
    assert len(cfg.cells()) == 12 and cfg.seeds_of("l-1000") == (0, 1, 2)
    over = scaling_study.build_overrides(cfg, "xl", 500)
    assert "chess.enabled=true" in over and "chess.model.hidden_size=192" in over
    assert "chess.train.steps=500" in over
    scaling_study.check(cfg)
    countdown = load_config(ScalingConfig,
                            path=ROOT / "configs" / "scaling_countdown.yaml")
    assert "model.num_layers=6" in scaling_study.build_overrides(countdown, "xl", 250)
