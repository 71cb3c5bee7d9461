"""The published recipes (configs/recipes/) print exactly the settings docs/benchmarks.md
lists for them, with their sources, and the ES recipe runs on a Qwen2-shaped model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "configs" / "recipes"
PRINTERS = {"es_countdown_paper": [sys.executable, "-m", "es_llm", "es"],
            "grpo_countdown_paper": [sys.executable, "-m", "es_llm", "grpo"],
            "experiment_countdown_paper": [sys.executable, str(ROOT / "scripts" / "experiment.py")]}


def docs_table() -> dict[str, dict[str, str]]:
    """recipe -> {key: value cell} of the "Recipes" table in docs/benchmarks.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text[text.index("## Recipes"):]
    rows: dict[str, dict[str, str]] = {}
    for line in section.splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in PRINTERS:
            rows.setdefault(cells[0], {})[cells[1]] = cells[2]
    return rows


def flat(data: dict) -> dict:
    """{dotted key: value}, as the experiment compares configs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from experiment import _flat

    return _flat(data)


def same(cell: str, value) -> bool:
    if isinstance(value, str):
        return cell.strip('"') == value
    return yaml.safe_load(cell) == value


@pytest.mark.parametrize("recipe", sorted(PRINTERS))
def test_a_recipe_prints_the_settings_of_the_docs_table(recipe):
    table = docs_table()[recipe]
    path = RECIPES / f"{recipe}.yaml"
    proc = subprocess.run([*PRINTERS[recipe], "--config", str(path), "--print-config"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    printed = flat(yaml.safe_load(proc.stdout))
    # The table lists exactly the keys the recipe file sets ...
    assert set(table) == set(flat(yaml.safe_load(path.read_text()))), recipe
    # ... and each with the value the command resolves for it.
    wrong = {k: (cell, printed.get(k)) for k, cell in table.items()
             if k not in printed or not same(cell, printed[k])}
    assert not wrong, wrong


@pytest.mark.slow
def test_the_es_recipe_runs_an_iteration_on_a_qwen2_shaped_model(standin, shared_data, tmp_path):
    """The ES paper's recipe as written (its 200 training rows of countdown.json, answer tag,
    float16 serving over a float32 master copy), shrunk only in population, prompts,
    tokens and length to fit a CPU, on the random-init Qwen2 stand-in."""
    out = tmp_path / "es"
    proc = subprocess.run(
        [sys.executable, "-m", "es_llm", "es", "--config", str(RECIPES / "es_countdown_paper.yaml"),
         "--out", str(out), "--no-progress", f"model={standin('qwen2')}",
         f"task.data={shared_data / 'countdown' / 'countdown.json'}", "iterations=1",
         "es.population=4", "prompts_per_iteration=4", "max_tokens=16", "backend=hf",
         "runtime.device=cpu"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["runtime"]["dtype"] == "float16" and config["task"]["select"] == "0:200"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["samples/generated"] == 4 * 4
    assert (out / "checkpoints" / "final" / "model.safetensors").is_file()
