"""The one-command head-to-head experiment at ci size, end to end: testbed, ES under mpirun and
GRPO at a matched budget with 3 seeds each, the comparison of every final checkpoint; and the
standalone coverage-analysis scripts on its samples."""

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


@pytest.mark.slow
@pytest.mark.mpi
def test_experiment_trains_both_methods_at_a_matched_budget_and_compares_them(experiment):
    out, proc = experiment
    comp = json.loads((out / "compare" / "comparison.json").read_text())
    assert set(comp["methods"]) == {"base", "es", "grpo"}
    for method in ("es", "grpo"):
        assert comp["methods"][method]["models"] == [f"{method}@{s}" for s in (0, 1, 2)]
        # The same number of generated samples per run, read from each run's own metrics.
        assert comp["budget"][method] == [256.0, 256.0, 256.0]
    assert set(comp["training"]) == {f"{m}@{s}" for m in ("es", "grpo") for s in (0, 1, 2)}
    assert "mpirun -n 2" in (out / "commands.txt").read_text()
    # Greedy and sampled views on the held-out problems and on a never-seen set.
    cap = comp["capability"]
    assert [e["data"] for e in cap["sets"]] == ["held-out", "never_seen"]
    assert cap["temperatures"] == ["T=0.6", "T=1"]
    for entry in cap["sets"]:
        assert set(entry["methods"]) == {"base", "es", "grpo"}
        assert set(entry["vs_reference"]) == {"es", "grpo"}
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
def test_rerunning_the_experiment_skips_what_is_done(experiment):
    out, _ = experiment
    before = (out / "runs" / "grpo-seed1" / "checkpoints" / "final" / "model.safetensors").read_bytes()
    proc = script("experiment.py", "--config", CONFIG, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = (out / "commands.txt").read_text()
    # Training ran once per method and seed (the first call); the rerun only compared again.
    assert commands.count("-m es_llm es ") == 3 and commands.count("-m es_llm grpo ") == 3
    assert commands.count("-m es_llm compare ") == 2
    # Every model's samples are reused: the main ones and five views (held-out greedy and
    # T = 0.6; never-seen greedy, T = 0.6 and T = 1; held-out T = 1 is the main comparison).
    assert proc.stdout.count("reusing") == 7 * 6
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
