"""The non-finite guard (``es_llm.finite``): a run that diverges stops at the first NaN or
inf with one paragraph and exit 2 (a step size's doing) or 1 (not), writes valid JSON with
null and a flag for it, and never saves the diverged weights; the checkpoints before it
stay. End to end on SFT, GRPO and ES with settings that diverge within two steps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from es_llm.backends.hf import nucleus_sample
from es_llm.cli import main
from es_llm.errors import BadInput, NonFinite
from es_llm.es.engine import check_es_update
from es_llm.finite import (Diverged, check, check_start, check_update, finite_row,
                           last_checkpoint, stop_error)
from es_llm.run_folder import AppendLog
from populations import es as pes
from populations.optimizers import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
ES = ROOT / "configs" / "es_countdown_ci.yaml"
GRPO = ROOT / "configs" / "grpo_countdown_ci.yaml"


def strict_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file, refusing the NaN / Infinity that Python's json accepts."""
    def refuse(name):
        raise AssertionError(f"{path} holds a bare {name}")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def stopped(capsys, args: list[str], status: int = 2) -> str:
    assert main(args) == status, args
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_row_with_nan_and_inf_becomes_json_with_nulls_and_a_flag(tmp_path):
    row = {"step": 3, "loss": math.nan, "grad_norm": math.inf, "lr": 1e-4, "tag": "x"}
    assert finite_row(row) == {"step": 3, "loss": None, "grad_norm": None, "lr": 1e-4,
                               "tag": "x", "nonfinite": ["loss", "grad_norm"]}
    assert finite_row({"step": 1, "loss": 0.5}) == {"step": 1, "loss": 0.5}
    log = AppendLog(tmp_path / "m.jsonl", "again")
    log.write_row(row)
    log.close()
    assert strict_rows(tmp_path / "m.jsonl")[0]["nonfinite"] == ["loss", "grad_norm"]


@pytest.mark.parametrize("quantity, moved, status", [
    ("update", False, 2), ("update", True, 2), ("loss", True, 2), ("gradient norm", True, 2),
    ("loss", False, 1), ("next-token logits", False, 1), ("reward", True, 1)])
def test_whose_doing_a_divergence_is(tmp_path, quantity, moved, status):
    """A step size is to blame once updates have moved the weights, or when the update
    itself is non-finite; a reward is a task's number by contract, never a setting's."""
    with pytest.raises(Diverged) as caught:
        check(quantity, "k", math.nan, moved)
    err = stop_error(caught.value, "step", 4, "Lower optim.lr (now 1)", tmp_path)
    assert err.status == status
    assert str(err).startswith(f"the run stopped at step 4, where the {quantity} came out nan")
    assert ("Lower optim.lr (now 1)" in str(err)) == (status == 2)


def test_the_last_finite_checkpoint_is_named(tmp_path):
    for step in (2, 10, 4):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{step}" / "config.json").write_text("{}")
    (tmp_path / "checkpoints" / "step_12").mkdir()  # a checkpoint cut short: no config.json
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_10"
    assert "step_10" in str(stop_error(Diverged("loss", "k", math.inf, True), "step", 11, "x",
                                       tmp_path))


def test_an_update_that_leaves_a_weight_non_finite_is_caught():
    params = [torch.ones(3), torch.tensor([1.0, -math.inf, math.nan])]
    with pytest.raises(Diverged) as caught:
        check_update(params, "grad/update")
    assert caught.value.quantity == "update" and caught.value.value == -math.inf
    check_update([torch.ones(2)], "grad/update")  # finite: nothing raised


def test_a_starting_model_with_nan_weights_is_bad_input():
    with pytest.raises(BadInput, match=r"NaN or inf weights in 1 tensor\(s\) \(first: b\)"):
        check_start([("a", torch.zeros(2)), ("b", torch.tensor([0.0, math.nan]))], "m")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_hf_sampler_refuses_nan_logits_instead_of_picking_a_token(temperature):
    logits = torch.tensor([[0.1, 0.2, 0.3], [math.nan, 0.0, 0.0]])
    with pytest.raises(NonFinite, match="next-token logits hold NaN or inf"):
        nucleus_sample(logits, temperature, 1.0, torch.Generator().manual_seed(0))
    finite = nucleus_sample(logits[:1], temperature, 1.0, torch.Generator().manual_seed(0))
    assert finite.shape == (1,)


def test_an_es_update_that_overflows_float16_is_caught_before_it_is_served():
    cfg = pes.ESConfig(population=2, optimizer="sgd", lr=1.0)
    big = {"w": torch.full((2,), 7e4)}  # above float16's largest 65504
    state = pes.ESState(big, make_optimizer(cfg).init(big), seed=0, iteration=1)
    metrics = {"es/grad_norm": 1.0, "es/update_norm": 1.0}
    check_es_update(metrics, state, "float32", True)  # fits float32
    with pytest.raises(Diverged, match="float16"):
        check_es_update(metrics, state, "float16", True)
    with pytest.raises(Diverged) as caught:
        check_es_update({**metrics, "es/update_norm": math.inf}, state, "float32", False)
    assert caught.value.by_setting


@pytest.mark.parametrize("setting, fragment", [
    ("optim.lr=1e38", "overflow float32"), ("optim.beta1=1", "must lie in [0, 1)")])
def test_adamw_settings_torch_would_crash_on_are_refused_at_load(ci_testbed, tmp_path, capsys,
                                                                 setting, fragment):
    err = stopped(capsys, ["grpo", "--config", str(GRPO), "--out", str(tmp_path / "o"),
                           f"model={ci_testbed}", setting])
    assert fragment in err and not (tmp_path / "o").exists()


def _sft_rows(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Use 3 {k} to make {3 + k}.",
                                        "completion": f" <answer>3+{k}</answer>"}) + "\n"
                            for k in range(8)))
    return rows


def test_sft_at_a_runaway_learning_rate_stops_and_saves_nothing(ci_testbed, tmp_path, capsys):
    out = tmp_path / "sft"
    err = stopped(capsys, ["sft", "--model", str(ci_testbed), "--data", str(_sft_rows(tmp_path)),
                           "--out", str(out), "--no-progress", "epochs=1", "batch_size=4",
                           "optim.lr=1e30"])
    assert "stopped at step 1" in err and "Lower optim.lr (now 1e+30)" in err
    rows = strict_rows(out / "metrics.jsonl")
    assert len(rows) == 2 and math.isfinite(rows[0]["loss"])
    assert rows[1]["step"] == 1 and rows[1]["nonfinite"] and rows[1]["diverged"]
    assert not (out / "checkpoints").exists()


def test_sft_from_a_model_with_nan_weights_is_refused(ci_testbed, tmp_path, capsys):
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", str(ci_testbed), str(bad)], check=True)
    weights = load_file(bad / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone().fill_(math.nan)
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    err = stopped(capsys, ["sft", "--model", str(bad), "--data", str(_sft_rows(tmp_path)),
                           "--out", str(tmp_path / "o"), "--no-progress"])
    assert "NaN or inf weights" in err and name in err


def test_grpo_that_diverges_keeps_the_checkpoint_before_it(ci_testbed, tmp_path, capsys):
    """lr=1e10 moves the policy so far in one Adam step that its logits overflow: the next
    step's rollouts cannot be sampled. The step_1 checkpoint (after step 0) stays finite."""
    out = tmp_path / "grpo"
    err = stopped(capsys, ["grpo", "--config", str(GRPO), "--out", str(out), "--no-progress",
                           f"model={ci_testbed}", "backend=hf", "optim.lr=1e10",
                           "task.format_weight=0.5", "checkpoint_every=1"])
    assert "stopped at step 1" in err and "next-token logits" in err and "step_1" in err
    rows = strict_rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["nonfinite"] == ["rollout/logits"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_1"]
    kept = load_file(out / "checkpoints" / "step_1" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in kept.values())


def test_es_that_diverges_stops_with_a_ledger_of_finite_iterations(ci_testbed, tmp_path,
                                                                   capsys):
    out = tmp_path / "es"
    err = stopped(capsys, ["es", "--config", str(ES), "--out", str(out), "--no-progress",
                           f"model={ci_testbed}", "es.lr=1e10", "task.format_weight=0.5"])
    assert "stopped at iteration 1" in err and "Lower es.lr (now 1e+10)" in err
    assert len(strict_rows(out / "ledger.jsonl")) == 1
    assert strict_rows(out / "metrics.jsonl")[1]["diverged"] == "next-token logits"
    assert not (out / "checkpoints" / "final").exists()


@pytest.mark.mpi
def test_es_under_mpirun_stops_on_every_rank_with_one_error_line(ci_testbed, tmp_path):
    mpirun = Path(sys.executable).parent / "mpirun"
    out = tmp_path / "es"
    proc = subprocess.run([str(mpirun), "-n", "2", sys.executable, "-m", "es_llm", "es",
                           "--config", str(ES), "--out", str(out), "--no-progress",
                           f"model={ci_testbed}", "es.lr=1e10", "task.format_weight=0.5"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "stopped at iteration 1" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(strict_rows(out / "ledger.jsonl")) == 1
