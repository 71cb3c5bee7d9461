"""SWARR's converted model: the sliding-window architecture, its window convention on both
backends, the conversion build, RL and ES on it, and bad settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from es_llm.cli import main
from es_llm.errors import BadInput
from es_llm.testbed.config import load_testbed_config
from es_llm.testbed.swa import NO_SFT, convert, layer_types

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ci_swa() -> Path:
    """The ci testbed with its sliding-window conversion (swa/, swa/no_sft/)."""
    from es_llm.testbed.build import build_testbed

    path, _ = build_testbed(load_testbed_config("ci", overrides=["swa.enabled=true"]),
                            progress=False, echo=lambda *_: None)
    return path


def _student(ci_testbed):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32).eval()


def _held_out_ids(folder: Path, count: int = 4) -> list[list[int]]:
    """Prompt plus reference solution of a few held-out problems, as token ids."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    rows = [json.loads(x) for x in (folder / "data" / "countdown_eval.jsonl").open()]
    return [tok(r["prompt"] + r["reference"]).input_ids for r in rows[-count:]]


def test_layer_types_slide_the_chosen_layers():
    assert layer_types(3, ()) == ["sliding_attention"] * 3
    assert layer_types(4, (1, 3)) == ["full_attention", "sliding_attention",
                                      "full_attention", "sliding_attention"]


def test_a_window_longer_than_the_sequence_gives_the_students_logits(ci_testbed):
    student = _student(ci_testbed)
    wide = convert(student, window=256, layers=())
    narrow = convert(student, window=8, layers=())
    for ids in _held_out_ids(ci_testbed):
        assert len(ids) > 40
        x = torch.tensor([ids])
        with torch.no_grad():
            want = student(x).logits
            assert torch.equal(wide(x).logits, want)
            # The first 8 positions see the same keys either way; later ones do not.
            got = narrow(x).logits
        assert torch.equal(got[0, :8], want[0, :8])
        assert (got[0, 8:] - want[0, 8:]).abs().max() > 1e-3


def test_only_the_chosen_layers_slide(ci_testbed):
    """With the window on layer 1 only, layer 0's output is the student's; with every layer
    sliding it is not (past the window)."""
    student = _student(ci_testbed)
    ids = torch.tensor([_held_out_ids(ci_testbed)[0]])
    outputs = {}
    for name, model in (("student", student), ("top", convert(student, 4, (1,))),
                        ("all", convert(student, 4, ()))):
        with torch.no_grad():
            outputs[name] = model(ids, output_hidden_states=True).hidden_states[1]
    assert torch.equal(outputs["top"], outputs["student"])
    assert not torch.equal(outputs["all"], outputs["student"])


def _parity_script(mode: str, arg: Path) -> dict:
    # vLLM engines share process-wide state: each check runs in a process of its own.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "swa_parity_check.py"), mode,
                           str(arg)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
@pytest.mark.slow
def test_both_backends_keep_window_keys_per_query(tmp_path):
    """A query attends to itself and the window - 1 tokens before it: the token window - 1
    places back moves the last position's log-probs, the one window places back does not,
    in transformers and in vLLM (whose CPU attention reads the per-layer window)."""
    r = _parity_script("convention", tmp_path)
    assert r["hf_inside_changes"] > 1e-3 and r["hf_outside_changes"] == 0.0
    assert r["vllm_inside_changes"] > 1e-3 and r["vllm_outside_changes"] < 1e-6
    assert r["vllm_vs_hf_probe"] < 1e-4


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_matches_transformers_past_the_window(ci_swa):
    r = _parity_script("parity", ci_swa / "swa")
    assert r["model_window"] == 8 and r["parity_longest"] > 4 * r["model_window"]
    assert r["parity_tokens"] > 100
    assert r["parity_max_abs_diff"] < 1e-4, r


def test_testbed_builds_the_converted_model_before_and_after_sft(ci_swa, ci_testbed):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    info = json.loads((ci_swa / "testbed.json").read_text())["swa"]
    assert info["path"] == "swa" and info["window"] == 8
    assert info["train"]["steps"] == 60
    for folder in (ci_swa / "swa", ci_swa / "swa" / NO_SFT):
        config = AutoConfig.from_pretrained(folder)
        assert config.model_type == "ministral" and config.sliding_window == 8
        assert config.layer_types == ["sliding_attention"] * 2
        assert (folder / "data" / "countdown_eval.jsonl").is_file()
    student = load_file(ci_testbed / "model.safetensors")
    raw = load_file(ci_swa / "swa" / NO_SFT / "model.safetensors")
    tuned = load_file(ci_swa / "swa" / "model.safetensors")
    assert set(raw) == set(student)
    assert all(torch.equal(raw[k], student[k]) for k in student)
    assert any(not torch.equal(tuned[k], student[k]) for k in student)
    # The swa settings are not part of the student's fingerprint.
    assert load_testbed_config("ci", overrides=["swa.window=4"]).fingerprint() == \
        load_testbed_config("ci").fingerprint()


@pytest.mark.slow
def test_grpo_and_es_train_the_converted_model_under_its_window(ci_swa, tmp_path):
    from transformers import AutoConfig

    grpo = tmp_path / "grpo"
    assert main(["grpo", "--config", str(ROOT / "configs" / "grpo_swarr_countdown.yaml"),
                 "--out", str(grpo), "--no-progress", f"model={ci_swa / 'swa'}", "steps=2",
                 "backend=hf", "rollout.prompts_per_step=4", "rollout.group_size=4",
                 "rollout.max_tokens=32"]) == 0
    es = tmp_path / "es"
    assert main(["es", "--config", str(ROOT / "configs" / "es_countdown_ci.yaml"), "--out",
                 str(es), "--no-progress", f"model={ci_swa / 'swa'}", "iterations=2",
                 "backend=hf", "es.population=4", "prompts_per_iteration=2",
                 "max_tokens=16"]) == 0
    for final in (grpo / "checkpoints" / "final", es / "checkpoints" / "final"):
        config = AutoConfig.from_pretrained(final)
        assert config.model_type == "ministral" and config.sliding_window == 8
        assert config.layer_types == ["sliding_attention"] * 2


@pytest.mark.parametrize("override, words", [
    ("swa.window=0", "positive"),
    ("swa.window=-3", "positive"),
    ("swa.window=257", "larger than the model's context"),
    ("swa.layers=[2]", "layer indices from 0 to 1"),
    ("swa.layers=[0,0]", "distinct"),
])
def test_bad_window_settings_are_refused_before_anything_is_written(override, words, tmp_path,
                                                                    capsys):
    with pytest.raises(BadInput, match=words):
        load_testbed_config("ci", overrides=[override])
    out = tmp_path / "tb"
    assert main(["testbed", "--size", "ci", "--out", str(out), "--no-progress", override]) == 2
    assert not out.exists()
    assert "swa." in capsys.readouterr().err
