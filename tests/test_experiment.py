"""The one-command head-to-head experiment at ci size, end to end: testbed, full-rank and
low-rank ES under mpirun and GRPO at a matched budget with 3 seeds each, an extended run, the
comparison of every final checkpoint with accuracy along the runs; and the standalone
coverage-analysis scripts on its samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from es_llm.io import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "experiment_countdown_ci.yaml"


def script(name: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def experiment(ci_testbed, tmp_path_factory):
    out = tmp_path_factory.mktemp("experiment") / "out"
    proc = script("experiment.py", "--config", CONFIG, "--out", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


def test_each_method_spends_the_budget_in_its_own_steps():
    sys.path.insert(0, str(ROOT / "scripts"))
    import experiment
    from es_llm.config import load_config

    # ES: 8 members x 16 prompts; low-rank: 64 members x 4 prompts each; GRPO: 8 x 4.
    cfg = load_config(experiment.ExperimentConfig, path=CONFIG)
    assert experiment.plan(cfg) == {"es": 256 // 128, "lowrank": 256 // 256, "grpo": 256 // 32}


@pytest.mark.slow
@pytest.mark.mpi
def test_experiment_trains_every_method_at_a_matched_budget_and_compares_them(experiment):
    out, proc = experiment
    comp = json.loads((out / "compare" / "comparison.json").read_text())
    methods = ("es", "lowrank", "grpo")
    assert set(comp["methods"]) == {"base", *methods}
    for method in methods:
        assert comp["methods"][method]["models"] == [f"{method}@{s}" for s in (0, 1, 2)]
        # The same number of generated samples per run, read from each run's own metrics.
        assert comp["budget"][method] == [256.0, 256.0, 256.0]
    assert set(comp["training"]) == {f"{m}@{s}" for m in methods for s in (0, 1, 2)}
    assert "mpirun -n 2" in (out / "commands.txt").read_text()
    # Greedy and sampled views on the held-out problems and on a never-seen set.
    cap = comp["capability"]
    assert [e["data"] for e in cap["sets"]] == ["held-out", "never_seen"]
    assert cap["temperatures"] == ["T=0.6", "T=1"]
    for entry in cap["sets"]:
        assert set(entry["methods"]) == {"base", *methods}
        assert set(entry["vs_reference"]) == set(methods)
    # Seeds differ, so the trained models differ.
    es_runs = [read_jsonl(out / "runs" / f"es-seed{s}" / "ledger.jsonl") for s in (0, 1, 2)]
    assert len({json.dumps(r[0]["rewards_N"]) for r in es_runs}) == 3
    # Every model's numbers in the report equal its own evaluation's metrics.json.
    for name, model in comp["models"].items():
        metrics = json.loads((out / "compare" / "samples" / name / "metrics.json").read_text())
        for k in (1, 2, 4):
            assert model["passk"][k - 1] == pytest.approx(metrics[f"pass@{k}"]["value"], abs=1e-12)
        assert model["num_solved"] == metrics["coverage"]["solved"]
    report = (out / "compare" / "report.md").read_text()
    assert "## Training budget" in report and "| es | 256 | 3 |" in report
    for name in comp["figures"].values():
        assert (out / "compare" / "figures" / name).stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.mpi
def test_an_extended_run_continues_a_copy_and_the_budget_study_reads_every_checkpoint(experiment):
    out, _ = experiment
    runs = out / "runs"
    ext = runs / "lowrank-seed0-x2"
    # The copy keeps the head-to-head run: its first iteration is the 1x run's, its step_1
    # checkpoint is the 1x final, and the 1x folder is untouched.
    first = read_jsonl(runs / "lowrank-seed0" / "ledger.jsonl")
    assert len(first) == 1 and read_jsonl(ext / "ledger.jsonl")[0] == first[0]
    assert len(read_jsonl(ext / "ledger.jsonl")) == 2
    assert ((ext / "checkpoints" / "step_1" / "model.safetensors").read_bytes()
            == (runs / "lowrank-seed0" / "checkpoints" / "final" / "model.safetensors").read_bytes())
    study = json.loads((out / "compare" / "comparison.json").read_text())["budget_study"]
    assert study["runs"] == {f"{m}@{s}": m for m in ("es", "lowrank", "grpo") for s in (0, 1, 2)}
    steps = {(r["method"], r["steps"]): r["seeds"] for r in study["rows"]}
    # ES: step_2 is final; low-rank: 1x for every seed, 2x for seed 0; GRPO: step_4 and final.
    assert steps == {("es", 2): 3, ("lowrank", 1): 3, ("lowrank", 2): 1, ("grpo", 4): 3,
                     ("grpo", 8): 3}
    lowrank = {r["steps"]: r for r in study["rows"] if r["method"] == "lowrank"}
    assert lowrank[2]["samples"] == 512.0 and lowrank[1]["samples"] == 256.0
    # The 1x point of every seed is that run's final checkpoint, read again on never-seen
    # problems: its greedy accuracy is the capability view's.
    never_seen = next(e for e in json.loads((out / "compare" / "comparison.json").read_text())
                      ["capability"]["sets"] if e["data"] == "never_seen")
    assert lowrank[1]["greedy"] == pytest.approx(never_seen["methods"]["lowrank"]["greedy"])
    assert "## Accuracy against training budget" in (out / "compare" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.mpi
def test_rerunning_the_experiment_skips_what_is_done(experiment):
    out, _ = experiment
    before = (out / "runs" / "grpo-seed1" / "checkpoints" / "final" / "model.safetensors").read_bytes()
    proc = script("experiment.py", "--config", CONFIG, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = (out / "commands.txt").read_text()
    # Training ran once per method and seed, and the extension once (the first call); the
    # rerun only compared again.
    assert commands.count("-m es_llm es ") == 7 and commands.count("-m es_llm grpo ") == 3
    assert commands.count("-m es_llm es --resume") == 1
    assert commands.count("-m es_llm compare ") == 2
    # Every model's samples are reused: the main ones and five views (held-out greedy and
    # T = 0.6; never-seen greedy, T = 0.6 and T = 1; held-out T = 1 is the main comparison);
    # and the budget study's greedy and sampled reads of the base model and of every
    # checkpoint (3 ES, 4 low-rank, 6 GRPO).
    assert proc.stdout.count("reusing") == 10 * 6 + 2 * (1 + 3 + 4 + 6)
    assert commands.count("unseen_countdown.py") == 1
    after = (out / "runs" / "grpo-seed1" / "checkpoints" / "final" / "model.safetensors").read_bytes()
    assert before == after


@pytest.mark.slow
@pytest.mark.mpi
def test_coverage_scripts_run_alone_on_the_experiment_samples(experiment, tmp_path):
    out, _ = experiment
    samples = out / "compare" / "samples"
    proc = script("passk_curves.py", f"base={samples / 'base'}", f"es@0={samples / 'es@0'}",
                  f"es@1={samples / 'es@1'}", f"grpo@0={samples / 'grpo@0'}", "--out",
                  tmp_path / "pk.png")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "pk.png").read_bytes()[:4] == b"\x89PNG"
    assert "crossover es vs base" in proc.stdout
    proc = script("coverage_overlap.py", samples / "base", samples / "grpo@0", "--list")
    assert proc.returncode == 0, proc.stderr
    comp = json.loads((out / "compare" / "comparison.json").read_text())
    pr = comp["models"]["grpo@0"]["vs_base"]
    assert f"{pr['num_progressions']} progressions, {pr['num_regressions']} regressions" in proc.stdout


def test_experiment_refuses_a_budget_the_methods_cannot_split(tmp_path):
    proc = script("experiment.py", "--config", CONFIG, "--out", tmp_path / "x", "budget_samples=100")
    assert proc.returncode == 2
    assert "budget_samples=100 is not a multiple of es's 128 samples per step" in proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("setting, message", [
    ("methods.es.kind=ppo", "'ppo'"),
    ("methods.lowrank.extend_seeds=[5]", "methods.lowrank.extend_seeds [5] are not training seeds"),
    ("budget.runs=[es@0=x]", "budget.runs is filled in by the experiment"),
    ("methods.base={kind: es, config: configs/es_countdown_ci.yaml}", "must be letters")])
def test_bad_methods_are_refused_before_anything_runs(tmp_path, setting, message):
    proc = script("experiment.py", "--config", CONFIG, "--out", tmp_path / "x", setting)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()


def _experiment_module():
    sys.path.insert(0, str(ROOT / "scripts"))
    import experiment
    return experiment


def test_studies_start_from_testbed_folders_and_read_the_experiment_folder(tmp_path):
    """The SWARR and LatentRevise studies: SFT runs have no budget, a method may start from
    a folder inside the testbed, and {out} in overrides is the experiment folder."""
    experiment = _experiment_module()
    from es_llm.config import load_config

    lr = load_config(experiment.ExperimentConfig,
                     path=ROOT / "configs" / "experiment_latent_revise.yaml")
    assert experiment.plan(lr) == {"grpo": 120, "grpo_lr": 120, "sft_lr": None,
                                   "sft_base": None}
    out, testbed = tmp_path / "lr", tmp_path / "lr" / "testbed"
    sft = experiment.training_command(lr.methods["sft_lr"], lr, 1, None, testbed,
                                      out / "runs" / "sft_lr-seed1", out)
    assert sft[2:4] == ["es_llm", "sft"] and f"data={out}/recover/recovered.jsonl" in sft
    assert f"model={testbed}" in sft and "seed=1" in sft
    assert not any(a.startswith(("steps=", "iterations=")) for a in sft)
    grpo = experiment.training_command(lr.methods["grpo_lr"], lr, 0, 120, testbed,
                                       out / "runs" / "grpo_lr-seed0", out)
    assert f"algo.recovered.data={out}/recover/recovered.jsonl" in grpo and "steps=120" in grpo
    # An unfinished SFT run starts over (es-llm sft has no --resume).
    (out / "runs" / "sft_lr-seed1").mkdir(parents=True)
    (out / "runs" / "sft_lr-seed1" / "config.yaml").write_text("{}")
    again = experiment.training_command(lr.methods["sft_lr"], lr, 1, None, testbed,
                                        out / "runs" / "sft_lr-seed1", out)
    assert "--resume" not in again and not (out / "runs" / "sft_lr-seed1").exists()
    swarr = load_config(experiment.ExperimentConfig, path=ROOT / "configs" / "experiment_swarr.yaml")
    assert swarr.methods["grpo_swa"].model == "swa" and swarr.references["swa_no_sft"] == "swa/no_sft"
    assert experiment.plan(swarr) == {"grpo_full": 120, "grpo_swa": 120, "es_swa": 15}


@pytest.mark.parametrize("setting, message", [
    ("references={base: swa}", "may not reuse"),
    ("references={grpo: swa}", "may not reuse"),
    ("methods.sft_lr.extend=2", "no budget to extend"),
    ("methods.sft_lr.overrides=[epochs=0]", "epochs must be at least 1"),
    ("latent_revise.overrides=[bootstrap=1]", "bootstrap must be at least 10")])
def test_bad_study_settings_are_refused(tmp_path, setting, message):
    proc = script("experiment.py", "--config", ROOT / "configs" / "experiment_latent_revise.yaml",
                  "--out", tmp_path / "x", setting)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_testbed_folder_is_reused_only_with_every_enabled_part_as_configured(tmp_path):
    """SWARR's testbed enables the sliding-window conversion, which the student's
    fingerprint leaves out: a folder built without it, or with other settings, is rebuilt."""
    experiment = _experiment_module()
    from es_llm.config import load_config
    from es_llm.testbed.config import load_testbed_config

    cfg = load_config(experiment.ExperimentConfig, path=ROOT / "configs" / "experiment_swarr.yaml")
    want = load_testbed_config(cfg.testbed, None, list(cfg.testbed_overrides))
    other = load_testbed_config(cfg.testbed, None, [*cfg.testbed_overrides, "swa.window=8"])
    info = {"size": cfg.testbed, "fingerprint": want.fingerprint()}
    (tmp_path / "testbed.json").write_text(json.dumps(info))
    assert not experiment.same_testbed(tmp_path, cfg)
    (tmp_path / "testbed.json").write_text(json.dumps({**info, "swa": {"key": other.swa_key()}}))
    assert want.fingerprint() == other.fingerprint() and not experiment.same_testbed(tmp_path, cfg)
    (tmp_path / "testbed.json").write_text(json.dumps({**info, "swa": {"key": want.swa_key()}}))
    assert experiment.same_testbed(tmp_path, cfg)
