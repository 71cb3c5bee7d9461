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
from unusable_outs import KINDS, unusable_out, untouched

from es_llm.io import read_jsonl
from es_llm.studies import ExperimentConfig

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
    cfg = load_config(ExperimentConfig, path=CONFIG)
    assert experiment.plan(cfg) == {"es": 256 // 128, "lowrank": 256 // 256, "grpo": 256 // 32,
                                    "es_anchor": 256 // 128}


@pytest.mark.slow
@pytest.mark.mpi
def test_experiment_trains_every_method_at_a_matched_budget_and_compares_them(experiment):
    out, proc = experiment
    comp = json.loads((out / "compare" / "comparison.json").read_text())
    methods = ("es", "lowrank", "grpo", "es_anchor")
    assert set(comp["methods"]) == {"base", *methods}
    for method in methods:
        assert comp["methods"][method]["models"] == [f"{method}@{s}" for s in (0, 1, 2)]
        # The same number of generated samples per run, read from each run's own metrics.
        assert comp["training_samples"][method] == [256.0, 256.0, 256.0]
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
    assert study["runs"] == {f"{m}@{s}": m for m in ("es", "lowrank", "grpo", "es_anchor")
                             for s in (0, 1, 2)}
    steps = {(r["method"], r["steps"]): r["seeds"] for r in study["rows"]}
    # ES: step_2 is final; low-rank: 1x for every seed, 2x for seed 0; GRPO: step_4 and final.
    assert steps == {("es", 2): 3, ("lowrank", 1): 3, ("lowrank", 2): 1, ("grpo", 4): 3,
                     ("grpo", 8): 3, ("es_anchor", 2): 3}
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
def test_the_report_says_what_training_did_to_the_weights_and_to_another_task(experiment):
    """compare_overrides reach the comparison: the geometry of every trained model, the
    chosen straight lines at connectivity.n samples per problem, and off-task drift of every
    model and along every run, anchored ES beside plain ES."""
    out, _ = experiment
    comp = json.loads((out / "compare" / "comparison.json").read_text())
    trained = {f"{m}@{s}" for m in ("es", "lowrank", "grpo", "es_anchor") for s in (0, 1, 2)}
    assert set(comp["geometry"]["models"]) == trained
    con = comp["connectivity"]
    assert con["n"] == 1 and con["alphas"] == [0.0, 0.5, 1.0]
    assert [(p["a"], p["b"]) for p in con["pairs"]] == [("base", "es@0"), ("es@0", "grpo@0")]
    middle = read_jsonl(out / "compare" / "samples" / "connectivity" / "es@0_to_grpo@0"
                        / "alpha_0.5" / "pass1" / "samples.jsonl")
    assert len(middle) == 40  # one sample on each of the 40 problems, not sampling.n = 4
    (task,) = comp["drift"]["tasks"]
    assert set(task["models"]) == {"base", *trained}
    assert task["models"]["base"]["change"]["diff"] == 0 and task["models"]["base"]["kl"] == 0
    assert {r["label"] for r in comp["drift"]["runs"]} == trained
    # The anchored arm ran with the decay from the same base and seeds as plain ES: the first
    # iteration (theta = theta0, no pull yet) is the same, the final weights are not.
    anchored, plain = (out / "runs" / "es_anchor-seed0", out / "runs" / "es-seed0")
    assert "anchor_decay: 1.0" in (anchored / "config.yaml").read_text()
    assert (read_jsonl(anchored / "ledger.jsonl")[0]["rewards_N"]
            == read_jsonl(plain / "ledger.jsonl")[0]["rewards_N"])
    final = "checkpoints/final/model.safetensors"
    assert (anchored / final).read_bytes() != (plain / final).read_bytes()
    report = (out / "compare" / "report.md").read_text()
    for heading in ("## Update geometry", "## Linear connectivity", "## Off-task drift"):
        assert heading in report


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
    assert commands.count("-m es_llm es ") == 10 and commands.count("-m es_llm grpo ") == 3
    assert commands.count("-m es_llm es --resume") == 1
    assert commands.count("-m es_llm compare ") == 2
    # Every model's samples are reused: the main ones and five views (held-out greedy and
    # T = 0.6; never-seen greedy, T = 0.6 and T = 1; held-out T = 1 is the main comparison);
    # the budget study's greedy and sampled reads of the base model and of every checkpoint
    # (3 ES, 4 low-rank, 6 GRPO, 3 anchored ES); the drift section's greedy reads of every
    # model and every checkpoint; and connectivity's greedy and sampled reads of 3 points on
    # each of 2 pairs (theta(alpha) is written to the same folder again).
    assert proc.stdout.count("reusing") == (13 * 6 + 2 * (1 + 3 + 4 + 6 + 3) + (13 + 16)
                                            + 2 * 3 * 2)
    assert commands.count("unseen_countdown.py") == 1
    after = (out / "runs" / "grpo-seed1" / "checkpoints" / "final" / "model.safetensors").read_bytes()
    assert before == after


@pytest.mark.slow
@pytest.mark.mpi
def test_a_rerun_with_other_method_settings_is_refused_and_changes_nothing(experiment):
    """The finished runs were trained at lr 1e-4: kept under a label that says 0.5 they would
    be reported as what they are not."""
    out, _ = experiment
    files = [out / "experiment.yaml", out / "commands.txt", out / "compare" / "comparison.json",
             out / "runs" / "grpo-seed0" / "config.yaml"]
    before = [f.read_bytes() for f in files]
    proc = script("experiment.py", "--config", CONFIG, "--out", out,
                  "methods.grpo.overrides=[optim.lr=0.5]")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "runs/grpo-seed0 holds method grpo's seed-0 run" in proc.stderr
    assert "(optim.lr: 0.0001 -> 0.5)" in proc.stderr and "new --out" in proc.stderr
    assert [f.read_bytes() for f in files] == before


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
    ("methods.base={kind: es, config: configs/es_countdown_ci.yaml}", "must be letters"),
    ("compare_overrides=[sampling.n=2]", "compare_overrides may not set sampling"),
    ("compare_overrides=[geometry.nonsense=1]", "compare_overrides (settings of `es-llm "
                                                "compare`): unknown config key"),
    ('compare_overrides=["connectivity.pairs=[es@7:grpo@0]"]',
     "names 'es@7', which is no model of the comparison")])
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

    lr = load_config(ExperimentConfig,
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
    swarr = load_config(ExperimentConfig, path=ROOT / "configs" / "experiment_swarr.yaml")
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
    """SWARR's window builds enable the sliding-window conversion, which the student's
    fingerprint leaves out: a folder built without it, or with another window, is rebuilt;
    the base build of a sweep has no conversion, so one holding any is reused as well."""
    experiment = _experiment_module()
    from es_llm.config import load_config
    from es_llm.testbed.config import load_testbed_config

    cfg = load_config(ExperimentConfig, path=ROOT / "configs" / "experiment_swarr.yaml")
    builds = experiment.testbed_builds(cfg)
    assert sorted(builds, key=str) == [16, 32, 64, None]
    assert builds[32][-2:] == ["swa.enabled=true", "swa.window=32"]
    want = load_testbed_config(cfg.testbed, None, builds[16])
    other = load_testbed_config(cfg.testbed, None, builds[32])
    info = {"size": cfg.testbed, "fingerprint": want.fingerprint()}
    (tmp_path / "testbed.json").write_text(json.dumps(info))
    assert not experiment.same_testbed(tmp_path, cfg, builds[16])
    assert experiment.same_testbed(tmp_path, cfg)
    (tmp_path / "testbed.json").write_text(json.dumps({**info, "swa": {"key": other.swa_key()}}))
    assert want.fingerprint() == other.fingerprint()
    assert not experiment.same_testbed(tmp_path, cfg, builds[16])
    (tmp_path / "testbed.json").write_text(json.dumps({**info, "swa": {"key": want.swa_key()}}))
    assert experiment.same_testbed(tmp_path, cfg, builds[16])


@pytest.mark.parametrize("setting, message", [
    ("budget_samples=-64", "budget_samples must be at least 1"),
    ("seeds=[]", "seeds is empty"),
    ("seeds=[0,1,0]", "seeds [0, 1, 0] repeat [0]"),
    ("ranks=0", "ranks must be at least 1"),
    ("eval_limit=0", "eval_limit must be at least 1"),
    ("views_n=0", "views_n must be at least 1"),
    ("never_seen_per_tier=-1", "never_seen_per_tier must be 0"),
    ("temperatures=[0.0]", "temperatures must be above 0"),
    ("eval_backend=vlm", "unknown eval_backend 'vlm'"),
    ("testbed=huge", "unknown testbed size 'huge'")])
def test_settings_no_stage_could_run_are_refused_before_anything_is_written(
        tmp_path, capsys, setting, message):
    experiment = _experiment_module()
    assert experiment.main(["--config", str(CONFIG), "--out", str(tmp_path / "x"), setting]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_an_out_that_cannot_be_a_folder_is_refused(tmp_path, capsys, kind):
    experiment = _experiment_module()
    out = unusable_out(tmp_path, kind)
    assert experiment.main(["--config", str(CONFIG), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(out)!r}" in err and err.count("\n") == 1, err
    assert untouched(tmp_path)


def _trained(folder: Path, run_cfg, rows: int | None = None) -> None:
    """A run folder as its trainer leaves it: config.yaml (the resolved config and the
    machine), and with ``rows`` that many metrics rows and a final checkpoint."""
    from es_llm.config import run_config_yaml

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(run_config_yaml(run_cfg))
    if rows is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n"
                                                      for i in range(rows)))
        (folder / "checkpoints" / "final").mkdir(parents=True)
        (folder / "checkpoints" / "final" / "config.json").write_text("{}")


def _ci_runs(out: Path) -> None:
    """What the ci experiment's trainers wrote for seed 0 of grpo (8 steps, finished) and of
    lowrank (1 iteration, and its copy continued to 2): each config as the command line
    gave it, with the testbed's training prompts as data."""
    from es_llm.config import load_config
    from es_llm.es.config import ESRunConfig
    from gradient.config import GRPORunConfig

    testbed = out / "testbed"
    (testbed / "data").mkdir(parents=True)
    (testbed / "data" / "countdown_rl.jsonl").write_text("")
    given = [f"model={testbed}", "seed=0", f"task.data={testbed}/data/countdown_rl.jsonl"]
    _trained(out / "runs" / "grpo-seed0", load_config(
        GRPORunConfig, path=ROOT / "configs" / "grpo_countdown_ci.yaml",
        overrides=[*given, "steps=8", "checkpoint_every=4"]), rows=8)
    lowrank = ROOT / "configs" / "es_countdown_lowrank_ci.yaml"
    _trained(out / "runs" / "lowrank-seed0",
             load_config(ESRunConfig, path=lowrank, overrides=[*given, "iterations=1"]), rows=1)
    _trained(out / "runs" / "lowrank-seed0-x2", load_config(
        ESRunConfig, path=lowrank, overrides=[*given, "iterations=2", "checkpoint_every=1"]),
        rows=2)


def _check_kept(out: Path, *overrides: str) -> None:
    """check_kept_outputs of the ci experiment (seed 0) with ``overrides`` on ``out``."""
    from es_llm.config import load_config

    experiment = _experiment_module()
    cfg = load_config(ExperimentConfig, path=CONFIG,
                      overrides=["seeds=[0]", *overrides])
    experiment.check_kept_outputs(cfg, out, experiment.plan(cfg))


def _es_run_config(out: Path, iterations: int):
    """The resolved config of the ci experiment's es run of seed 0 at ``iterations``."""
    from es_llm.config import load_config
    from es_llm.es.config import ESRunConfig

    return load_config(ESRunConfig, path=ROOT / "configs" / "es_countdown_ci.yaml",
                       overrides=[f"model={out / 'testbed'}", "seed=0", f"iterations={iterations}",
                                  f"task.data={out}/testbed/data/countdown_rl.jsonl"])


def test_kept_runs_must_have_the_settings_the_experiment_now_gives_them(tmp_path):
    """A rerun skips finished runs and continues the others, so their config.yaml must be
    what the experiment would now resolve, but for the keys --resume may change; a
    finished run's length must be the budget asked for now."""
    from es_llm.errors import BadInput

    out = tmp_path / "out"
    _ci_runs(out)
    _check_kept(out)
    # checkpoint_every is a resume key, so dropping the grpo override leaves only the lr.
    with pytest.raises(BadInput, match=r"grpo-seed0 holds method grpo's seed-0 run made with "
                                       r"other settings .* \(optim\.lr: 0\.0001 -> 0\.5\)"):
        _check_kept(out, "methods.grpo.overrides=[optim.lr=0.5]")
    with pytest.raises(BadInput, match=r"lowrank-seed0 holds .*\(es\.sigma: "):
        _check_kept(out, "methods.lowrank.overrides=[es.sigma=0.5]")
    # A larger budget continues every run (none of them is finished at it).
    _check_kept(out, "budget_samples=512")
    # A run finished at 4 iterations is not the 2-iteration run asked for now.
    _trained(out / "runs" / "es-seed0", _es_run_config(out, 4), rows=4)
    with pytest.raises(BadInput, match=r"es-seed0 holds .*\(iterations: 4 -> 2\)"):
        _check_kept(out)
    _check_kept(out, "budget_samples=512")


def test_kept_runs_are_not_relabelled_by_a_rebuilt_testbed_or_a_shorter_budget(tmp_path):
    from es_llm.config import dump_yaml, load_config, run_config_yaml
    from es_llm.errors import BadInput

    out = tmp_path / "out"
    _ci_runs(out)
    first = load_config(ExperimentConfig, path=CONFIG,
                        overrides=["seeds=[0]"])
    (out / "experiment.yaml").write_text(dump_yaml(first))
    _check_kept(out)
    with pytest.raises(BadInput, match="trained from a testbed that this experiment would "
                                       "rebuild"):
        _check_kept(out, "testbed_overrides=[teachers.enabled=false,train.steps=7]")
    # An unfinished run that already went past the budget asked for now cannot end at it.
    es = out / "runs" / "es-seed0"
    es.mkdir(parents=True)
    (es / "config.yaml").write_text(run_config_yaml(_es_run_config(out, 4)))
    (es / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in range(3)))
    with pytest.raises(BadInput, match=r"es-seed0 holds .*unfinished after 3 steps, longer "
                                       r"than the 2"):
        _check_kept(out)


def test_a_changed_rerun_is_refused_before_anything_is_written(tmp_path, capsys):
    experiment = _experiment_module()
    out = tmp_path / "out"
    _ci_runs(out)
    (out / "experiment.yaml").write_text("the first run's\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert experiment.main(["--config", str(CONFIG), "--out", str(out), "seeds=[0]",
                            "methods.grpo.overrides=[optim.lr=0.5]"]) == 2
    err = capsys.readouterr().err
    assert "optim.lr: 0.0001 -> 0.5" in err and "new --out" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_kept_recovery_and_finished_sft_run_must_match_the_settings(tmp_path):
    """LatentRevise's folder is skipped once it has metrics.json; a finished SFT run is
    skipped, an unfinished one starts over whatever its settings."""
    experiment = _experiment_module()
    from es_llm.config import load_config
    from es_llm.errors import BadInput
    from gradient.commands.recovery import LatentReviseConfig
    from gradient.loop.sft import SFTRunConfig

    out = tmp_path / "out"
    testbed = out / "testbed"
    (testbed / "data").mkdir(parents=True)
    (testbed / "data" / "countdown_rl.jsonl").write_text("")
    _trained(out / "recover", load_config(
        LatentReviseConfig, path=ROOT / "configs" / "latent_revise_countdown.yaml",
        overrides=[f"model={testbed}", f"task.data={testbed}/data/countdown_rl.jsonl"]))
    (out / "recover" / "metrics.json").write_text("{}")
    sft = ROOT / "configs" / "sft_countdown.yaml"
    _trained(out / "runs" / "sft_lr-seed0", load_config(SFTRunConfig, path=sft, overrides=[
        f"model={testbed}", "seed=0", f"data={out}/recover/recovered.jsonl"]), rows=3)
    _trained(out / "runs" / "sft_base-seed0",
             load_config(SFTRunConfig, path=sft, overrides=[f"model={testbed}", "epochs=9"]))

    def check(*overrides):
        cfg = load_config(ExperimentConfig,
                          path=ROOT / "configs" / "experiment_latent_revise.yaml",
                          overrides=["seeds=[0]", *overrides])
        experiment.check_kept_outputs(cfg, out, experiment.plan(cfg))

    check()
    with pytest.raises(BadInput, match=r"recover holds LatentRevise's .*\(search\.n: 16 -> 8\)"):
        check("latent_revise.overrides=[search.n=8]")
    with pytest.raises(BadInput, match=r"sft_lr-seed0 holds .*\(epochs: 3 -> 1\)"):
        check('methods.sft_lr.overrides=["data={out}/recover/recovered.jsonl", epochs=1]')


SWARR = ROOT / "configs" / "experiment_swarr.yaml"
SWARR_CI = ROOT / "configs" / "experiment_swarr_ci.yaml"


def test_a_window_sweep_runs_every_arm_of_the_conversion_once_per_window(tmp_path):
    """Methods and references that start from the conversion get one arm per window, from
    that window's build; the others run once from the base; the table gets one arm per
    window and method, against the same full-attention run."""
    experiment = _experiment_module()
    from es_llm.config import load_config

    cfg = load_config(ExperimentConfig, path=SWARR)
    out = tmp_path / "swarr"
    arms = experiment.arms(cfg, out)
    assert arms["grpo_full"] == ("grpo_full", out / "testbed")
    assert arms["grpo_swa_w32"] == ("grpo_swa", out / "windows" / "w32" / "swa")
    assert sorted(arms) == sorted(["grpo_full"] + [f"{m}_w{w}" for m in ("grpo_swa", "es_swa")
                                                   for w in (16, 32, 64)])
    refs = experiment.references(cfg, out)
    assert refs["swa_no_sft_w64"] == out / "windows" / "w64" / "swa" / "no_sft"
    assert len(refs) == 6
    table = experiment.conversion_overrides(cfg)
    assert "conversion.grpo_swa_w16.converted=swa_sft_w16" in table
    assert "conversion.grpo_swa_w16.rl_full=grpo_full" in table
    assert "conversion.es_swa_w64.rl=es_swa_w64" in table
    assert not any(t.startswith("conversion.es_swa_w64.rl_full") for t in table)
    # Every arm trains and is read at up to 128 new tokens.
    assert cfg.sampling.max_tokens == 128
    for name, (method, start) in arms.items():
        run = experiment.resolved_run_config(
            cfg.methods[method], experiment.run_overrides(cfg.methods[method], 0, 1, start, out,
                                                          cfg))
        assert (run.rollout.max_tokens if method.startswith("grpo") else run.max_tokens) == 128


def test_runs_are_not_relabelled_by_a_window_build_with_other_settings(tmp_path):
    """A window's build holding a conversion made with other settings (here another SFT
    length) would be rebuilt under the runs trained from it: refused; the same build is
    kept."""
    experiment = _experiment_module()
    from es_llm.config import load_config
    from es_llm.errors import BadInput
    from es_llm.testbed.config import load_testbed_config

    cfg = load_config(ExperimentConfig, path=SWARR)
    out = tmp_path / "swarr"
    (out / "runs" / "grpo_swa_w16-seed0").mkdir(parents=True)
    builds = experiment.testbed_builds(cfg)
    for overrides in (builds[16], [*builds[16], "swa.train.steps=7"]):
        tb = load_testbed_config(cfg.testbed, None, overrides)
        folder = experiment.window_folder(out, 16)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "testbed.json").write_text(json.dumps({
            "size": cfg.testbed, "fingerprint": tb.fingerprint(), "swa": {"key": tb.swa_key()}}))
        if overrides is builds[16]:
            experiment.check_kept_outputs(cfg, out, experiment.plan(cfg))
    with pytest.raises(BadInput, match="trained from a testbed that this experiment would "
                                       "rebuild"):
        experiment.check_kept_outputs(cfg, out, experiment.plan(cfg))


@pytest.mark.parametrize("setting, message", [
    ("swarr.windows=[]", "swarr.windows is an empty sweep"),
    ("swarr.windows=[0,16]", "swarr.windows must be distinct positive numbers of tokens"),
    ("swarr.windows=[-8]", "swarr.windows must be distinct positive numbers of tokens"),
    ("swarr.windows=[16,16]", "swarr.windows must be distinct positive numbers of tokens"),
    ("swarr.windows=[16,300]", "swarr.windows [300] are longer than the context the models "
                               "run at (256 tokens"),
    ("runtime.max_model_len=12", "swarr.windows [16] are longer than the context the models "
                                 "run at (12 tokens"),
    ("model=somewhere", "with a model of your own (model=PATH) set swarr.windows to null"),
    ("references={}", "swarr.converted 'swa_sft' is not a reference"),
    ("swarr.rl={grpo_full: grpo_swa}", "with a sweep, swarr.converted and the keys of swarr.rl"),
    ("swarr.rl={grpo_swa: es}", "swarr.rl maps methods to methods")])
def test_a_bad_sweep_is_refused_before_anything_is_built(tmp_path, capsys, setting, message):
    experiment = _experiment_module()
    extra = ["swarr.windows=[16]"] if "max_model_len" in setting else []
    out = tmp_path / "x"
    assert experiment.main(["--config", str(SWARR), "--out", str(out), *extra, setting]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_sweep_with_nothing_under_the_window_is_refused(tmp_path, capsys):
    experiment = _experiment_module()
    assert experiment.main(["--config", str(CONFIG), "--out", str(tmp_path / "x"),
                            "swarr.windows=[8]"]) == 2
    err = capsys.readouterr().err
    assert "no method or reference starts from the conversion" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_the_sweep_and_its_per_tier_table_end_to_end(ci_testbed, tmp_path):
    """The ci sweep: one conversion per window, GRPO on each and on the full-attention
    student, the converted models, and the table per tier with both framings; a rerun
    builds and trains nothing again."""
    out = tmp_path / "swarr"
    proc = script("experiment.py", "--config", SWARR_CI, "--out", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for w in (8, 16):
        info = json.loads((out / "windows" / f"w{w}" / "testbed.json").read_text())
        assert info["swa"]["window"] == w
        for seed in (0, 1, 2):
            assert (out / "runs" / f"grpo_swa_w{w}-seed{seed}" / "checkpoints" / "final").is_dir()
    assert "swa" not in json.loads((out / "testbed" / "testbed.json").read_text())
    comp = json.loads((out / "compare" / "comparison.json").read_text())
    assert set(comp["methods"]) == {"base", "swa_sft_w8", "swa_sft_w16", "grpo_full",
                                    "grpo_swa_w8", "grpo_swa_w16"}
    table = comp["conversion"]
    assert set(table) == {"grpo_swa_w8", "grpo_swa_w16"}
    arm = table["grpo_swa_w8"]
    assert arm["models"] == {"full": "base", "converted": "swa_sft_w8", "rl": "grpo_swa_w8",
                             "rl_full": "grpo_full"}
    assert [r["tier"] for r in arm["rows"]] == ["2", "3", "4", "all"]
    assert [r["problems"] for r in arm["rows"]] == [15, 30, 15, 60]
    # The all-problems row's pass@1 is each model's own (the summary's pass@1).
    for role, name in arm["models"].items():
        assert arm["rows"][-1]["pass1"][role] == pytest.approx(
            comp["methods"][name]["passk"]["mean"][0], abs=1e-12)
    report = (out / "compare" / "report.md").read_text()
    assert "## Conversion: what RL wins back" in report and "### grpo_swa_w16" in report
    commands = (out / "commands.txt").read_text()
    proc = script("experiment.py", "--config", SWARR_CI, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = (out / "commands.txt").read_text()[len(commands):]
    assert "es_llm testbed" not in again and "es_llm grpo" not in again
    assert again.count("es_llm compare") == 1
