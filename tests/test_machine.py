"""What a result was computed on: recorded in testbed.json and every run folder's config,
dropped when a config is loaded back, and reported by `es-llm compare` when the compared
models come from different machines."""

from __future__ import annotations

import json

import numpy as np
import yaml

from es_llm.cli import main
from es_llm.config import load_config
from es_llm.evaluate import EvalConfig
from es_llm.machine import machine_info, machine_kind
from test_compare_analysis import write_samples


def test_machine_info_names_the_cpu_and_the_torch_build():
    import torch

    info = machine_info()
    assert info["cpu"] and info["torch"] == str(torch.__version__)
    assert machine_kind(info).startswith(info["cpu"] + " / " + info["torch"])
    assert machine_kind({"cpu": "X", "torch": "2", "gpu": "H200"}) == "X / 2 / H200"


def test_testbed_and_run_folders_record_their_machine(ci_testbed, tmp_path):
    assert json.loads((ci_testbed / "testbed.json").read_text())["machine"] == machine_info()
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(ci_testbed), "--task", "countdown", "--n", "1",
                 "--backend", "hf", "--out", str(out), "--no-progress", "task.limit=2"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["machine"] == machine_info()
    # The record is provenance, not a setting: the folder's config loads back as a config.
    cfg = load_config(EvalConfig, path=out / "config.yaml")
    assert cfg.model == str(ci_testbed) and cfg.sampling.n == 1


def with_machine(folder, cpu: str):
    config = folder / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["machine"] = {"cpu": cpu, "torch": "2.13.0+cpu", "python": "3.11.7",
                       "system": "Linux x86_64"}
    config.write_text(yaml.safe_dump(data))
    return folder


def test_compare_says_when_models_come_from_different_machines(tmp_path, capsys):
    rng = np.random.default_rng(0)
    base = with_machine(write_samples(tmp_path / "base", rng.random((6, 4)) < 0.5), "AMD EPYC")
    same = with_machine(write_samples(tmp_path / "same", rng.random((6, 4)) < 0.5), "AMD EPYC")
    other = with_machine(write_samples(tmp_path / "other", rng.random((6, 4)) < 0.5),
                         "Intel Xeon")
    out = tmp_path / "one-machine"
    assert main(["compare", "--models", f"base={base}", f"es={same}", "--out", str(out),
                 "--no-progress", "--bootstrap", "50"]) == 0
    assert "Different machines" not in (out / "report.md").read_text()
    out = tmp_path / "two-machines"
    assert main(["compare", "--models", f"base={base}", f"es={other}", "--out", str(out),
                 "--no-progress", "--bootstrap", "50"]) == 0
    report = (out / "report.md").read_text()
    assert "Different machines" in report and "Intel Xeon" in report and "AMD EPYC" in report
    machines = json.loads((out / "comparison.json").read_text())["machines"]
    assert machines["es"]["sampled"].startswith("Intel Xeon")
    capsys.readouterr()


def test_resuming_on_another_kind_of_machine_is_said(tmp_path):
    from es_llm.config import run_config_yaml
    from es_llm.run_folder import other_machine

    (tmp_path / "config.yaml").write_text(run_config_yaml(EvalConfig()))
    assert other_machine(tmp_path) is None
    with_machine(tmp_path, "Intel Xeon")
    assert "started on Intel Xeon" in other_machine(tmp_path)
