"""Every setting is discoverable from the command line: --help-config lists the config keys
(type, default, meaning, valid choices) from the dataclasses, --print-config shows the
resolved config and runs nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from es_llm.cli import main, registered_commands
from es_llm.config import load_config
from es_llm.config_help import config_keys, field_comments

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = registered_commands()


def help_config(command: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "es_llm", command, "--help-config"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def entry(text: str, key: str) -> str:
    """The listing of ``key``: its line and the indented description under it, in one
    line with single spaces."""
    lines = text[text.index(f"\n{key}  (") + 1:].splitlines()
    block = [lines[0]] + [ln for ln in _indented(lines[1:])]
    return " ".join(" ".join(block).split())


def _indented(lines):
    for line in lines:
        if not line.startswith("    "):
            return
        yield line


def test_es_help_config_documents_its_keys():
    text = help_config("es")
    assert "es.sigma  (float, default 0.001)\n    Noise scale" in text
    assert "es.population  (int, default 30)" in text
    # A choice field lists what its registry accepts.
    assert entry(text, "es.shaping").endswith("Choices: centered_rank, group_zscore, pair_diff, raw, zscore.")
    assert "comm_timeout_s  (float, default 300.0)" in text


def test_grpo_help_config_lists_the_registered_losses():
    from gradient.maths.losses import loss_names

    text = help_config("grpo")
    assert entry(text, "algo.loss").endswith(f"Choices: {', '.join(loss_names())}.")
    assert "algo.kl.estimator" in text and "optim.warmup_steps" in text


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_key_of_every_command_is_described(command):
    keys = config_keys(COMMANDS[command].config_class())
    assert keys
    undocumented = [k["key"] for k in keys if not k["help"]]
    assert not undocumented, undocumented


def test_comments_are_read_from_the_source_and_shared_by_groups():
    from gradient.config import RolloutSettings

    comments = field_comments(RolloutSettings)
    assert comments["prompts_per_step"].startswith("Prompts per optimizer step (P)")
    # group_size sits right below prompts_per_step: one comment describes both.
    assert comments["group_size"] == comments["prompts_per_step"]
    assert comments["max_tokens"] == "Longest rollout in tokens."


def test_print_config_resolves_file_flags_and_overrides_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["es", "--config", str(ROOT / "configs" / "es_countdown.yaml"), "--out",
                 str(out), "--print-config", "es.sigma=0.02", "--model", "somewhere"]) == 0
    text = capsys.readouterr().out
    data = yaml.safe_load(text)
    assert data["es"]["sigma"] == 0.02 and data["model"] == "somewhere"
    assert data["iterations"] == 40  # from the file
    assert data["comm_timeout_s"] == 300.0  # a default
    assert not out.exists()
    # The printed config is a config file: loading it gives the same config.
    from es_llm.es.config import ESRunConfig
    saved = tmp_path / "resolved.yaml"
    saved.write_text(text)
    assert load_config(ESRunConfig, path=saved) == load_config(
        ESRunConfig, path=ROOT / "configs" / "es_countdown.yaml",
        overrides=["es.sigma=0.02", "model=somewhere"])


def test_print_config_for_the_other_commands(capsys):
    assert main(["testbed", "--size", "ci", "--print-config", "train.steps=7"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["train"]["steps"] == 7
    assert main(["grpo", "--config", str(ROOT / "configs" / "dapo_countdown.yaml"),
                 "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["algo"]["dynamic_sampling"]["enabled"]
    assert main(["compare", "--models", "base=x", "--n", "8", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["sampling"]["n"] == 8
