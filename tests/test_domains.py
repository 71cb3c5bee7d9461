"""The testbed's domain models (code: pyfunc, chess) build, never train on their held-out
sets, evaluate through `es-llm eval`, and their ES and GRPO configs run end to end."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from es_llm.cli import main
from es_llm.testbed.config import DOMAINS, load_testbed_config
from es_llm.testbed.domains import example_stream, held_out

ROOT = Path(__file__).resolve().parents[1]
DOMAIN_GRPO_CONFIGS = ["grpo_code.yaml", "grpo_code_ci.yaml", "grpo_chess.yaml",
                       "grpo_chess_ci.yaml"]


@pytest.mark.parametrize("name", list(DOMAINS))
def test_held_out_sets_are_deterministic_and_never_trained_on(name):
    cfg = load_testbed_config("ci")
    sets, excluded = held_out(name, cfg)
    again, _ = held_out(name, cfg)
    task = DOMAINS[name]
    assert [p.prompt for p in sets[f"{task}_eval"]] == [p.prompt for p in again[f"{task}_eval"]]
    prompts = {p.prompt for split in sets.values() for p in split}
    assert len(prompts) == sum(len(v) for v in sets.values())
    # Training examples drawn from the stream (chess: from a small pool) are never held out.
    if getattr(cfg, name).pool_per_tier:
        cfg = replace(cfg, **{name: replace(getattr(cfg, name), pool_per_tier=50)})
    draw = example_stream(name, cfg, excluded, progress=False)
    rng = random.Random(0)
    drawn = [draw(rng) for _ in range(300)]
    assert not prompts & {p for p, _ in drawn}
    assert all(c.strip() for _, c in drawn)


def test_ci_domain_models_are_built_with_their_held_out_sets(ci_domains):
    info = json.loads((ci_domains / "testbed.json").read_text())
    from transformers import AutoModelForCausalLM

    for name, task in DOMAINS.items():
        part = info[name]
        assert part["path"] == name and part["task"] == task
        folder = ci_domains / name
        for split in ("eval", "rl"):
            assert (folder / "data" / f"{task}_{split}.jsonl").is_file()
        assert 0.0 <= part["report"]["pass@1"] <= 1.0
        AutoModelForCausalLM.from_pretrained(folder)
    # The code model learned something: its pass@k is not zero.
    top = f"pass@{info['code']['report']['samples']}"
    assert info["code"]["report"][top] > 0


@pytest.mark.parametrize("name", list(DOMAINS))
def test_eval_runs_the_domain_task_on_the_testbed(ci_domains, tmp_path, name):
    task = DOMAINS[name]
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(ci_domains / name), "--task", task, "--n", "2",
                 "--limit", "12", "--backend", "hf", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["data"].endswith(f"{task}_eval.jsonl")
    rows = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(rows) == 24 and {r["problem_id"] for r in rows} <= {
        json.loads(line)["id"] for line in (ci_domains / name / "data" / f"{task}_eval.jsonl").open()}


# The default-size configs run one short iteration on the ci models, the ci ones as shipped.
SHORT = {"es": ["iterations=1", "es.population=4", "prompts_per_iteration=8"],
         "grpo": ["steps=1", "rollout.prompts_per_step=4", "rollout.group_size=4"]}


def _configs() -> list[tuple[str, str, str]]:
    return [(command, name, f"{command}_{name}{suffix}.yaml") for command in SHORT
            for name in DOMAINS for suffix in ("_ci", "")]


@pytest.mark.slow
@pytest.mark.parametrize("command,name,config", _configs(), ids=lambda v: v)
def test_es_and_grpo_domain_configs_run(ci_domains, tmp_path, command, name, config):
    out = tmp_path / command
    short = [] if config.endswith("_ci.yaml") else SHORT[command] + ["backend=hf"]
    assert main([command, "--config", str(ROOT / "configs" / config), "--out", str(out),
                 "--no-progress", f"model={ci_domains / name}", *short]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert len(lines) == (3 if not short else 1)
    if command == "es":
        assert all(0 <= m["es/reward_mean"] <= 1 for m in lines)
    assert (out / "checkpoints" / "final" / "config.json").is_file()


# Trainer configs only: a scaling_ study config names its domain and builds its own models
# (tests/test_scaling.py checks it).
@pytest.mark.parametrize("path", [p for p in sorted((ROOT / "configs").glob("*_code*.yaml")) +
                                  sorted((ROOT / "configs").glob("*_chess*.yaml"))
                                  if not p.name.startswith("scaling_")],
                         ids=lambda p: p.name)
def test_domain_configs_point_at_their_domain_model(path):
    import yaml

    cfg = yaml.safe_load(path.read_text())
    domain = "code" if "_code" in path.name else "chess"
    assert cfg["model"].endswith(f"/{domain}") and cfg["task"]["name"] == DOMAINS[domain]
