"""The off-task drift section of ``es-llm compare``: the KL on hand-made distributions and on
a tiny random model against itself and a perturbed copy, the base's drift against itself,
bad input, and the section end to end on the ci testbed."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from es_llm.cli import main
from es_llm.compare.config import CompareConfig, DriftConfig
from es_llm.compare.drift import (accuracy_changes, along_runs, budget_rows, drift_tasks,
                                  mean_kl, model_kl, task_result, token_kl)
from es_llm.compare.section import sections
from es_llm.errors import BadInput
from es_llm.io import write_jsonl_atomic
from es_llm.tasks import TaskConfig, arithmetic
from es_llm.testbed.standins import build_standin
from es_llm.testbed.train import record


def test_token_kl_by_hand_on_two_tokens_of_a_three_token_vocabulary():
    trained = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]]).log()
    base = torch.tensor([[[1 / 3, 1 / 3, 1 / 3], [0.2, 0.3, 0.5]]]).log()
    first = 0.5 * math.log(1.5) + 2 * 0.25 * math.log(0.75)
    both = token_kl(trained, base, torch.tensor([[True, True]]))
    assert both.shape == (1,) and float(both[0]) == pytest.approx(first / 2)
    assert float(token_kl(trained, base, torch.tensor([[1, 0]]))[0]) == pytest.approx(first)
    # A zero-probability token of the trained model adds nothing; a masked NaN is dropped.
    sure = torch.tensor([[[1.0, 0.0, 0.0], [float("nan")] * 3]]).log()
    assert float(token_kl(sure, base, torch.tensor([[1, 0]]))[0]) == pytest.approx(math.log(3))
    assert torch.isnan(token_kl(trained, base, torch.tensor([[0, 0]]))[0])


class CharTokenizer:
    """One id per character (ids 1..), a BOS of 0 unless special tokens are left out."""

    def __call__(self, text, add_special_tokens=True):
        ids = [1 + ord(c) % 15 for c in text]
        return SimpleNamespace(input_ids=([0] if add_special_tokens else []) + ids)


def _tiny_llama(seed):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    with torch.random.fork_rng(devices=[]):  # the session's RNG is left where it was
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def test_kl_of_a_model_to_itself_is_zero_and_of_a_perturbed_model_positive():
    base = _tiny_llama(0)
    perturbed = _tiny_llama(0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    prompts, completions = ["12+3=", "7*8="], ["15", "56 ok"]
    tok = CharTokenizer()
    assert model_kl(base, base, tok, prompts, completions) == [0.0, 0.0]
    kl = model_kl(perturbed, base, tok, prompts, completions)
    assert all(k > 0 for k in kl)
    # An empty completion has no token to compare on.
    assert model_kl(perturbed, base, tok, ["1+1="], [""]) == [None]


def test_drift_of_the_base_against_itself_is_zero_with_a_ci_of_zero():
    rng = np.random.default_rng(0)
    base = (rng.random(40) < 0.5).astype(float)
    worse = base * (rng.random(40) < 0.5)
    changes = accuracy_changes({"base": base, "es": worse}, "base", rng, 200)
    assert changes["base"]["diff"] == 0 and changes["base"]["ci95"] == [0.0, 0.0]
    assert changes["base"]["a"] == pytest.approx(base.mean())
    assert changes["es"]["diff"] == pytest.approx(worse.mean() - base.mean())
    assert changes["es"]["ci95"][0] <= changes["es"]["diff"] <= changes["es"]["ci95"][1]


def test_mean_kl_and_its_interval_over_prompts():
    zeros = mean_kl([0.0, 0.0, 0.0], np.random.default_rng(0), 100)
    assert zeros == {"kl": 0.0, "kl_ci95": [0.0, 0.0]}
    # An empty completion (None) is left out; the interval lies within the prompts' range.
    found = mean_kl([0.1, None, 0.3, 0.2], np.random.default_rng(0), 400)
    assert found["kl"] == pytest.approx(0.2)
    assert 0.1 <= found["kl_ci95"][0] < 0.2 < found["kl_ci95"][1] <= 0.3
    assert mean_kl([None], np.random.default_rng(0), 100) == {"kl": None, "kl_ci95": None}


def _section_input(**drift):
    cfg = CompareConfig(reference="base", bootstrap=200, drift=DriftConfig(enabled=True, **drift))
    return SimpleNamespace(cfg=cfg, rng=lambda: np.random.default_rng(cfg.metrics_seed))


def test_drift_along_a_run_whose_checkpoint_is_the_base_is_zero_and_the_table_says_so():
    """A run whose step-2 checkpoint reads like the base (same rows, KL 0 per prompt, as
    model_kl gives a model against itself) and whose final one lost a problem: the first
    point's change and KL are exactly 0 with intervals of 0, the second's are its own."""
    base = {f"p{i}": {"correct": i % 2 == 0} for i in range(6)}
    final = {**base, "p0": {"correct": False}}
    read = {"entry": {"label": "arithmetic_eval", "task": TaskConfig(name="arithmetic")},
            "rows": {"base": base, "es@0/step_2": base, "es@0/step_4": final},
            "ids": list(base)}
    kls = {"es@0/step_2": [0.0, 0.0, 0.0], "es@0/step_4": [0.2, None, 0.4]}
    task = task_result(_section_input(kl_prompts=3), read, kls)
    run = {"label": "es@0", "method": "es", "points": [
        {"checkpoint": "c2", "steps": 2, "samples": 200.0, "seconds": 4.0},
        {"checkpoint": "c4", "steps": 4, "samples": 400.0, "seconds": 12.0}]}
    (along,) = along_runs([run], [task])
    first, last = (p["tasks"]["arithmetic_eval"] for p in along["points"])
    assert first["change"]["diff"] == 0 and first["change"]["ci95"] == [0.0, 0.0]
    assert first["kl"] == 0 and first["kl_ci95"] == [0.0, 0.0]
    assert last["change"]["diff"] == pytest.approx(-1 / 6)
    assert last["accuracy"] == pytest.approx(2 / 6)
    assert last["kl"] == pytest.approx(0.3) and last["kl_per_prompt"] == [0.2, None, 0.4]
    rows = budget_rows({"reference": "base", "runs": [along]})
    assert rows == [["es@0", "2", "200", "4", "arithmetic_eval", "50.0%", "+0.0 [0.0, 0.0] pts",
                     "0.0000 [0.0000, 0.0000]"],
                    ["es@0", "4", "400", "12", "arithmetic_eval", "33.3%",
                     rows[1][6], f"0.3000 [{last['kl_ci95'][0]:.4f}, {last['kl_ci95'][1]:.4f}]"]]
    assert rows[1][6].startswith("-16.7 [")


def test_settings_are_checked_and_turn_the_section_on():
    with pytest.raises(BadInput, match="drift.kl_prompts must be at least 1"):
        DriftConfig(kl_prompts=0)
    with pytest.raises(BadInput, match="FILE or TASK=FILE"):
        DriftConfig(tasks=("arithmetic=",))
    assert [n for n, _ in sections(CompareConfig(drift=DriftConfig(enabled=True)))][-1] == "drift"
    assert "drift" not in [n for n, _ in sections(CompareConfig())]


def test_off_task_sets_are_files_or_task_files_and_default_to_the_arithmetic_set(
        standin, tmp_path):
    qwen = standin("qwen2")
    data = str(qwen / "data" / "countdown_eval.jsonl")
    cfg = CompareConfig(task=TaskConfig(limit=3, select="5:"),
                        drift=DriftConfig(enabled=True, tasks=(data, f"countdown={data}")))
    found = drift_tasks(cfg, qwen)
    # One file twice gets two labels; each set keeps the comparison's limit, not its rows.
    assert [f["label"] for f in found] == ["countdown_eval", "countdown_eval-1"]
    assert {(f["task"].name, f["task"].data, f["task"].limit, f["task"].select)
            for f in found} == {("countdown", data, 3, None)}
    ref = tmp_path / "ref"
    rng = random.Random(0)
    write_jsonl_atomic(ref / "data" / "arithmetic_eval.jsonl",
                       [record(arithmetic.generate(rng, 2)[0]) for _ in range(4)])
    (default,) = drift_tasks(CompareConfig(drift=DriftConfig(enabled=True)), ref)
    assert (default["label"], default["task"].name) == ("arithmetic_eval", "arithmetic")
    assert default["task"].data == str(ref / "data" / "arithmetic_eval.jsonl")


def test_bad_input_is_one_paragraph_with_status_2_and_nothing_written(standin, tmp_path, capsys):
    qwen = standin("qwen2")
    copy = tmp_path / "copy"
    shutil.copytree(qwen, copy)
    other_tokenizer = build_standin("qwen2", "ci", tmp_path / "other_tokenizer", seed=1)
    wider = tmp_path / "wider"
    shutil.copytree(qwen, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config,
                                                   "vocab_size": config["vocab_size"] + 8}))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    models = [f"base={qwen}", f"a={copy}"]
    data = str(qwen / "data" / "countdown_eval.jsonl")
    cases = [
        (models, ["--drift"], "none is given and the reference 'base' has no "
                              "data/arithmetic_eval.jsonl"),
        (models, ["--drift-tasks", str(tmp_path / "missing.jsonl")],
         "drift task file .*missing.jsonl' does not exist"),
        (models, ["--drift-tasks", f"countdown={empty}"], "empty.jsonl"),
        (models, ["--drift-tasks", data, "--drift-kl-prompts", "0"],
         "drift.kl_prompts must be at least 1"),
        ([f"base={other_tokenizer}", f"a={copy}"], ["--drift-tasks", data],
         "a's tokenizer has another vocabulary"),
        ([f"base={qwen}", f"a={wider}"], ["--drift-tasks", data],
         r"a's output layer has \d+ tokens and the reference 'base' has \d+"),
    ]
    capsys.readouterr()  # the builds' progress bars
    for models, extra, message in cases:
        out = tmp_path / "out"
        assert main(["compare", "--models", *models, "--drift", *extra, "--task", "countdown",
                     "--n", "1", "--backend", "hf", "--out", str(out),
                     "--no-progress"]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("es-llm compare: error:") and err.count("\n") == 1, err
        assert re.search(message, err), err
        assert not out.exists()


def _run(folder, checkpoints):
    """A finished training run in the layout ``--budget-runs`` reads: 4 logged ES iterations
    and ``checkpoints`` (name -> model folder copied in, e.g. step_2 and final)."""
    for name, model in checkpoints.items():
        shutil.copytree(model, folder / "checkpoints" / name)
    rows = [{"samples/generated": 100.0 * (i + 1), "perf/iter_s": 1.5 + i} for i in range(4)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_budget_run_checkpoints_not_of_the_reference_are_refused(standin, tmp_path, capsys):
    """A checkpoint of another tokenizer or architecture than the reference: one paragraph,
    status 2, nothing written (the runs' own checks are budget's)."""
    qwen = standin("qwen2")
    other_tokenizer = build_standin("qwen2", "ci", tmp_path / "other_tokenizer", seed=1)
    data = str(qwen / "data" / "countdown_eval.jsonl")
    cases = [(other_tokenizer, "es@0/step_4's tokenizer has another vocabulary"),
             (standin("llama"), "es@0/step_4 is a llama model")]
    capsys.readouterr()  # the builds' progress bars
    for i, (model, message) in enumerate(cases):
        run = _run(tmp_path / f"run{i}", {"step_2": qwen, "final": model})
        out = tmp_path / "out"
        assert main(["compare", "--models", f"base={qwen}", f"a={qwen}", "--drift",
                     "--drift-tasks", data, "--budget-runs", f"es@0={run}", "--task",
                     "countdown", "--n", "1", "--backend", "hf", "--out", str(out),
                     "--no-progress"]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("es-llm compare: error:") and err.count("\n") == 1, err
        assert message in err, err
        assert not out.exists()


def _perturbed_copy(model: Path, folder: Path) -> Path:
    """A copy of the model folder with seeded noise of scale 1e-2 on every float tensor."""
    shutil.copytree(model, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    save_file({k: v + 1e-2 * torch.randn(v.shape, generator=gen).to(v.dtype)
               if v.is_floating_point() else v for k, v in tensors.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.slow
def test_drift_end_to_end_on_the_ci_testbed(ci_testbed, tmp_path):
    """A perturbed copy of the ci testbed against it on the testbed's arithmetic set (the
    default) and its Countdown set: the reference's own drift is 0, the copy's KL is above 0."""
    es = _perturbed_copy(ci_testbed, tmp_path / "es")
    out = tmp_path / "r"
    common = ["compare", "--models", f"base={ci_testbed}", f"es={es}", "--task", "countdown",
              "--n", "1", "--limit", "6", "--backend", "hf", "--drift", "--drift-kl-prompts",
              "4", "--no-progress"]
    # The default off-task set: the testbed's arithmetic problems.
    assert main(common + ["--out", str(out)]) == 0
    drift = json.loads((out / "comparison.json").read_text())["drift"]
    assert drift["reference"] == "base"
    assert [t["task"] for t in drift["tasks"]] == ["arithmetic"]
    arithmetic = f"arithmetic={ci_testbed / 'data' / 'arithmetic_eval.jsonl'}"
    countdown = str(ci_testbed / "data" / "countdown_rl.jsonl")
    assert main(common + ["--drift-tasks", arithmetic, countdown, "--out", str(out)]) == 0
    again = json.loads((out / "comparison.json").read_text())["drift"]
    assert [t["task"] for t in again["tasks"]] == ["arithmetic", "countdown"]
    # The arithmetic reads of the first run are reused: the same numbers.
    assert again["tasks"][0] == drift["tasks"][0]
    for t in again["tasks"]:
        assert t["num_problems"] == 6 and t["kl_prompts"] == 4
        base, mine = t["models"]["base"], t["models"]["es"]
        assert base["change"]["diff"] == 0 and base["change"]["ci95"] == [0.0, 0.0]
        assert base["kl"] == 0.0 and mine["kl"] > 0
        assert len(mine["kl_per_prompt"]) == 4
        assert mine["change"]["diff"] == pytest.approx(mine["accuracy"] - base["accuracy"])
    report = (out / "report.md").read_text()
    assert "## Off-task drift" in report
    assert (out / "figures" / "drift.png").stat().st_size > 0


def test_drift_along_a_budget_run_end_to_end(ci_testbed, tmp_path):
    """A run whose step-2 checkpoint is the ci testbed (the reference) and whose final one a
    perturbed copy: along the run the base checkpoint's KL and accuracy change are exactly 0,
    the perturbed one's KL is above 0, and the report's table says what comparison.json does.
    The perturbed copy compared as a model too reads as its checkpoint does, and the models'
    numbers are the same without the run."""
    perturbed = _perturbed_copy(ci_testbed, tmp_path / "perturbed")
    run = _run(tmp_path / "run", {"step_2": ci_testbed, "final": perturbed})
    out = tmp_path / "r"
    common = ["compare", "--models", f"base={ci_testbed}", f"es={perturbed}", "--task",
              "countdown", "--n", "1", "--limit", "4", "--max-tokens", "48", "--backend", "hf",
              "--drift", "--drift-kl-prompts", "3", "--no-progress"]
    assert main(common + ["--budget-runs", f"es@0={run}", "budget.n=0", "--out", str(out)]) == 0
    drift = json.loads((out / "comparison.json").read_text())["drift"]
    # The models' own table keeps the models alone; the checkpoints are under the runs.
    assert [list(t["models"]) for t in drift["tasks"]] == [["base", "es"]]
    (along,) = drift["runs"]
    assert (along["label"], along["method"]) == ("es@0", "es")
    start, end = along["points"]
    assert (start["steps"], start["samples"], end["steps"], end["samples"]) == (2, 200.0, 4, 400.0)
    first, last = start["tasks"]["arithmetic_eval"], end["tasks"]["arithmetic_eval"]
    assert first["change"]["diff"] == 0 and first["change"]["ci95"] == [0.0, 0.0]
    assert first["kl_per_prompt"] == [0.0] * 3 and first["kl_ci95"] == [0.0, 0.0]
    assert last["kl"] > 0 and last["kl_ci95"][0] <= last["kl"] <= last["kl_ci95"][1]
    assert len(last["kl_per_prompt"]) == 3
    mine = drift["tasks"][0]["models"]["es"]
    assert (mine["accuracy"], mine["kl_per_prompt"]) == (last["accuracy"], last["kl_per_prompt"])
    report = (out / "report.md").read_text()
    assert "### Drift against training budget" in report
    lines = {line.split(" | ")[1]: line for line in report.splitlines()
             if line.startswith("| es@0 |")}
    for point in along["points"]:
        m = point["tasks"]["arithmetic_eval"]
        line = lines[str(point["steps"])]
        assert f"| {100 * m['accuracy']:.1f}% |" in line
        assert f"| {m['kl']:.4f} [{m['kl_ci95'][0]:.4f}, {m['kl_ci95'][1]:.4f}] |" in line
    assert (out / "figures" / "drift_budget.png").read_bytes()[:4] == b"\x89PNG"
    alone = tmp_path / "alone"
    assert main(common + ["--out", str(alone)]) == 0
    without = json.loads((alone / "comparison.json").read_text())["drift"]
    assert without["runs"] == [] and without["tasks"] == drift["tasks"]
    assert "Drift against training budget" not in (alone / "report.md").read_text()
    assert not (alone / "figures" / "drift_budget.png").exists()
