"""Every experiment YAML in configs/ loads into its dataclass (no stale keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from es_llm.config import load_config
from es_llm.evaluate import EvalConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("eval_*.yaml")), ids=lambda p: p.name)
def test_eval_configs_load(path):
    cfg = load_config(EvalConfig, path=path)
    assert cfg.sampling.n >= 1 and cfg.task.name


def test_testbed_presets_load():
    from es_llm.testbed.config import load_testbed_config
    assert load_testbed_config("ci").size == "ci"
    assert load_testbed_config("default").size == "default"


GRADIENT_PREFIXES = ("grpo_", "dapo_", "gspo_", "gapo_", "adaprefix_", "replay_", "opd_", "dllm_")


@pytest.mark.parametrize("path", sorted(p for p in CONFIGS.glob("*.yaml")
                                        if p.name.startswith(GRADIENT_PREFIXES)),
                         ids=lambda p: p.name)
def test_grpo_family_configs_load_and_are_exercised(path):
    from bitwise_runs import CASES
    from gradient.config import GRPORunConfig

    cfg = load_config(GRPORunConfig, path=path)
    assert cfg.rollout.group_size >= 2
    # Every shipped variant runs end to end in test_configs_bitwise.
    assert path.name in {c.config for c in CASES}


def test_every_config_belongs_to_a_command():
    known = ("eval_", "es_", "experiment_", "sft_", "latent_revise_", "scaling_") + GRADIENT_PREFIXES
    assert all(p.name.startswith(known) for p in CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("experiment_*.yaml")), ids=lambda p: p.name)
def test_experiment_configs_load_and_split_their_budget(path):
    import sys

    from es_llm.studies import ExperimentConfig

    # The budget's split is the script's: it loads every trainer's config, gradient's too.
    sys.path.insert(0, str(CONFIGS.parent / "scripts"))
    import experiment

    cfg = load_config(ExperimentConfig, path=path)
    steps = experiment.plan(cfg)
    # SFT runs are not budget-matched (None); every other method spends the budget.
    assert set(steps) == set(cfg.methods) and len(cfg.seeds) == 3
    assert all(steps[m] >= 1 for m in steps if cfg.methods[m].kind != "sft")
    assert all(steps[m] is None for m in steps if cfg.methods[m].kind == "sft")


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("scaling_*.yaml")), ids=lambda p: p.name)
def test_scaling_configs_load(path):
    from es_llm.studies import ScalingConfig

    cfg = load_config(ScalingConfig, path=path)
    assert cfg.cells() and all(cfg.seeds_of(c) for c in cfg.cells())


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("es_*.yaml")), ids=lambda p: p.name)
def test_es_configs_load(path):
    from es_llm.es.config import ESRunConfig

    cfg = load_config(ESRunConfig, path=path)
    assert cfg.iterations >= 1 and cfg.es.population >= 2
