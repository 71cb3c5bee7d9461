"""Shared fixtures: where the read-only evaluation data lives, the ci testbed model, and a tiny
random transformers model for unit tests that need no trained one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _shared_data_dir() -> Path:
    env = os.environ.get("ES_LLM_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = _shared_data_dir()
    if not path.is_dir():
        pytest.fail(f"evaluation data not found at {path}; set ES_LLM_SHARED_DATA")
    return path


@pytest.fixture(scope="session")
def ci_testbed() -> Path:
    """The ci testbed model folder (built once, then reused from the cache)."""
    from es_llm.testbed.build import build_testbed
    from es_llm.testbed.config import load_testbed_config

    path, _ = build_testbed(load_testbed_config("ci"), progress=False, echo=lambda *_: None)
    return path


@pytest.fixture(scope="session")
def ci_diffusion() -> Path:
    """The ci testbed with its diffusion model (off by default), built once into the cache."""
    from es_llm.testbed.build import build_testbed
    from es_llm.testbed.config import load_testbed_config

    path, _ = build_testbed(load_testbed_config("ci", overrides=["diffusion.enabled=true"]),
                            progress=False, echo=lambda *_: None)
    return path


@pytest.fixture(scope="session")
def vllm_engine(ci_testbed):
    """The one in-process vLLM engine of the test session, on the ci testbed, set up for ES
    (worker extension, no prefix caching). In-process engines share vLLM's global parallel
    state, so tests must not start a second one or tear this one down early."""
    pytest.importorskip("vllm")
    from es_llm.backends import BackendSpec, make_backend

    return make_backend(BackendSpec(str(ci_testbed), backend="vllm", weights="es"))


@pytest.fixture(scope="session")
def hf_engine(ci_testbed):
    from es_llm.backends import BackendSpec, make_backend

    return make_backend(BackendSpec(str(ci_testbed), backend="hf"))


@pytest.fixture(scope="session")
def ci_domains() -> Path:
    """The ci testbed with its code (pyfunc) and chess domain models, built once."""
    from es_llm.testbed.build import build_testbed
    from es_llm.testbed.config import load_testbed_config

    path, _ = build_testbed(load_testbed_config("ci", overrides=["code.enabled=true",
                                                                 "chess.enabled=true"]),
                            progress=False, echo=lambda *_: None)
    return path


@pytest.fixture(scope="session")
def ci_reasoning() -> Path:
    """The multi-role reasoning model of the ci testbed (its reasoning/ folder), built once."""
    from es_llm.testbed.build import build_testbed
    from es_llm.testbed.config import load_testbed_config

    path, _ = build_testbed(load_testbed_config("ci", overrides=["reasoning.enabled=true"]),
                            progress=False, echo=lambda *_: None)
    return path / "reasoning"


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """``standin(arch)``: the folder of that random-init stand-in (es_llm/testbed/standins.py,
    shape ci, float32, seed 0), built once per session on first use (a second or so each).
    Each is a model folder HF and vLLM both load, with its Countdown data and a ChatML chat
    template; a test that needs a vLLM engine on one runs it in a process of its own (see
    ``standin_vllm_check.py``)."""
    from es_llm.testbed.standins import build_standin

    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_standin(arch, "ci", tmp_path_factory.mktemp(f"standin-{arch}"))
        return built[arch]

    return get


@pytest.fixture
def tiny_qwen2():
    """A fresh tiny random Qwen2 causal LM (vocabulary 64, 2 layers), the same weights every
    time (seed 0), in eval mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()
