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
