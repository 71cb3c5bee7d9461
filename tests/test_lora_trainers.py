"""LoRA (``lora.enabled``) in the gradient trainers on the ci testbed: only the adapter moves,
checkpoints hold the merged model plus a PEFT adapter, rollouts agree with the trainer, resume
is exact, a dense reward rises, SFT and OPD train, and bad input is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from es_llm.cli import main
from es_llm.tasks import registry
from own_process import run_check
from test_es_direction import Sevens

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "configs" / "grpo_countdown_ci.yaml"
LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8"]
ALPHA_OVER_R = 2.0


def _sevens_args(ci_testbed) -> list[str]:
    """A dense reward on the countdown prompts, so every group has non-zero advantages."""
    return ["task.name=sevens", f"task.data={ci_testbed}/data/countdown_rl.jsonl"]


def _grpo(ci_testbed, out: Path, *overrides: str) -> int:
    with registry.TASKS.registered("sevens", Sevens):
        return main(["grpo", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                     f"model={ci_testbed}", *_sevens_args(ci_testbed), *LORA, *overrides])


def _merged_from_adapter(base: dict, adapter: dict) -> dict:
    """``W + (alpha / r) B A`` for every adapted module of a saved PEFT adapter, in float64
    (an independent reckoning of what the checkpoint should hold)."""
    out = {}
    for name, A in adapter.items():
        if ".lora_A." in name:
            module = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            B = adapter[name.replace(".lora_A.", ".lora_B.")]
            out[f"{module}.weight"] = (base[f"{module}.weight"].double()
                                       + ALPHA_OVER_R * B.double() @ A.double())
    return out


def test_a_lora_step_moves_only_the_adapter_and_saves_the_merged_model(ci_testbed, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    assert _grpo(ci_testbed, out, "steps=1", "backend=hf") == 0
    folder = out / "checkpoints" / "final"
    assert (folder / "trainer_state.pt").is_file() and (folder / "data").is_dir()
    base = load_file(ci_testbed / "model.safetensors")
    saved = load_file(folder / "model.safetensors")
    adapter = load_file(folder / "adapter" / "adapter_model.safetensors")
    assert adapter and any(float(t.abs().max()) > 0 for n, t in adapter.items() if "lora_B" in n)
    merged = _merged_from_adapter(base, adapter)
    assert merged and saved.keys() == base.keys()
    for name, W in saved.items():
        if name in merged:
            assert not torch.equal(W, base[name]), name  # the adapter moved it
            torch.testing.assert_close(W.double(), merged[name], rtol=0, atol=1e-6)
        else:
            assert torch.equal(W, base[name]), name  # every other weight is the base's
    # AdamW kept state for the adapter alone.
    state = torch.load(folder / "trainer_state.pt", weights_only=False)
    n_adapter = sum(t.numel() for t in adapter.values())
    n_optim = sum(s["exp_avg"].numel() for s in state["optimizer"]["state"].values())
    assert n_optim == n_adapter
    ids = torch.tensor([[3, 17, 25, 9, 41, 5, 12]])
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(input_ids=ids)
        peft = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32),
            folder / "adapter")(input_ids=ids)
    torch.testing.assert_close(peft.logits, plain.logits, rtol=0, atol=1e-5)


def test_the_base_stays_frozen_in_the_trainer(ci_testbed):
    from es_llm.config import load_config
    from es_llm.models import resolve_training_data
    from gradient.config import GRPORunConfig
    from gradient.loop.setup import build
    from gradient.loop.trainer import step

    with registry.TASKS.registered("sevens", Sevens):
        cfg = resolve_training_data(load_config(
            GRPORunConfig, path=CI_CONFIG,
            overrides=[f"model={ci_testbed}", *_sevens_args(ci_testbed), *LORA]))
        edges, problems, state = build(cfg)
        before = {n: p.detach().clone() for n, p in edges.model.named_parameters()}
        step(edges, cfg, state, problems)
    moved = {n for n, p in edges.model.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all(".lora_" in n for n in moved), sorted(moved)[:5]
    assert any(".lora_B." in n for n in moved)
    # The optimizer holds the adapter only.
    opt = {id(p) for g in edges.optimizer.param_groups for p in g["params"]}
    assert opt == {id(p) for n, p in edges.model.named_parameters() if ".lora_" in n}


def test_hf_rollout_logprobs_match_the_trainers_with_a_trained_adapter(ci_testbed):
    """The HF sampler decodes with the PEFT policy itself: its sampled tokens' log-probs are
    the trainer's (autoregressive estimator, same temperature)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.adapters import LoraSettings, wrap_model
    from es_llm.backends.base import SamplingParams
    from es_llm.backends.hf import HFBackend
    from es_llm.io import read_jsonl
    from gradient.dllm.estimators import EstimateInput, estimate

    model = wrap_model(AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32),
                       LoraSettings(rank=4, alpha=8), seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    tokenizer = AutoTokenizer.from_pretrained(ci_testbed)
    prompts = [r["prompt"] for r in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")[:8]]
    hf = HFBackend("", model=model, tokenizer=tokenizer, logprobs_mode="processed")
    out = hf.generate(prompts, SamplingParams(n=4, temperature=0.7, max_tokens=32, seed=5,
                                              logprobs=True))
    rows = [(list(tokenizer(p).input_ids), c) for p, row in zip(prompts, out) for c in row]
    with torch.no_grad():
        e = estimate("autoregressive", EstimateInput(
            model, [SimpleNamespace(prompt_ids=p, completion_ids=list(c.token_ids))
                    for p, c in rows], 0.7, pad_id=tokenizer.pad_token_id, mask_id=0,
            settings=None, with_entropy=False))
    engine_B_T = torch.zeros_like(e.logp_B_T)
    for i, (_, c) in enumerate(rows):
        engine_B_T[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    diff = (e.logp_B_T - engine_B_T).abs() * e.mask_B_T
    print({"tokens": float(e.mask_B_T.sum()), "max": float(diff.max()),
           "mean": float(diff.sum() / e.mask_B_T.sum())})
    assert float(e.mask_B_T.sum()) > 200
    assert float(diff.max()) < 1e-4, float(diff.max())


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_rollout_logprobs_match_the_trainers_with_a_trained_adapter(ci_testbed):
    """In separate processes (``vllm_lora_check.py``): vLLM's own LoRA serving (the trainers'
    path) and merged weights pushed into the engine, each against the trainer's log-probs of
    the same tokens (measured on CPU fp32, rank 8: served max 2.4e-5 / mean 4.1e-7, merged
    max 4.1e-5 / mean 5.5e-7)."""
    pytest.importorskip("vllm")
    result = run_check("vllm_lora_check.py", str(ci_testbed), timeout=600)
    print(result)
    assert result["served"]["tokens"] > 200 and result["merged"]["tokens"] > 200
    # Both ways agree with the trainer; the trainers use the served one (the closer).
    assert result["served"]["max"] < 1e-4, result
    assert result["merged"]["max"] < 1e-4, result
    # The adapter acts: the base model's log-probs of the same tokens are far off.
    assert result["base"]["mean"] > 1e-2, result


@pytest.mark.slow
def test_resume_with_lora_gives_bitwise_the_uninterrupted_weights(ci_testbed, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert _grpo(ci_testbed, full) == 0
    # Stopped after 2 steps (its checkpoint step_2 exists), then resumed to 4.
    assert _grpo(ci_testbed, part, "steps=2") == 0
    with registry.TASKS.registered("sevens", Sevens):
        assert main(["grpo", "--resume", str(part), "--no-progress", "steps=4"]) == 0
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a = load_file(full / "checkpoints" / "final" / name)
        b = load_file(part / "checkpoints" / "final" / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (name, k)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(load_file(full / "checkpoints" / "final" / "model.safetensors")[q],
                           load_file(ci_testbed / "model.safetensors")[q])
    rows = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


def _sevens_run(ci_testbed, tmp_path, backend, *overrides):
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "grpo_sevens_run.py"),
                           str(ci_testbed), str(tmp_path / "run"), backend, *overrides],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_lora_grpo_raises_a_dense_reward(ci_testbed, tmp_path):
    r = _sevens_run(ci_testbed, tmp_path, "hf", "lora.enabled=true", "lora.rank=8",
                    "lora.alpha=16", "lora.target_modules=[all-linear]", "optim.lr=3e-3")
    print(r)
    assert r["after"] > r["before"] + 0.05, r
    # Only the adapter's tensors moved: two per adapted linear layer.
    assert r["params_changed"] == r["adapter_params"], r


@pytest.mark.slow
@pytest.mark.vllm
def test_lora_grpo_with_vllm_rollouts_serves_the_updated_adapter(ci_testbed, tmp_path):
    pytest.importorskip("vllm")
    r = _sevens_run(ci_testbed, tmp_path, "vllm", "lora.enabled=true", "lora.rank=8",
                    "lora.alpha=16", "lora.target_modules=[all-linear]", "optim.lr=3e-3")
    print(r)
    assert r["after"] > r["before"] + 0.05, r
    assert r["params_changed"] == r["adapter_params"], r
    # The engine was given every new adapter version: its log-probs stay the trainer's (a
    # stale adapter would drift away as training moves the policy).
    assert max(d for d in r["is_diff"] if d is not None) < 1e-3, r["is_diff"]


def test_sft_with_lora_lowers_the_loss_and_saves_adapter_and_merged(ci_testbed, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from es_llm.io import write_jsonl_atomic

    rows = [json.loads(x) for x in (ci_testbed / "data" / "countdown_rl.jsonl").open()][:16]
    data = tmp_path / "rows.jsonl"
    write_jsonl_atomic(data, [{"prompt": r["prompt"], "completion": r["reference"]}
                              for r in rows])
    out = tmp_path / "sft"
    assert main(["sft", "--config", str(ROOT / "configs" / "sft_countdown.yaml"), "--out",
                 str(out), "--no-progress", f"model={ci_testbed}", f"data={data}",
                 "epochs=6", "batch_size=16", "optim.lr=3e-3", *LORA]) == 0
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - 0.05, losses
    folder = out / "checkpoints" / "final"
    base = load_file(ci_testbed / "model.safetensors")
    saved = load_file(folder / "model.safetensors")
    merged = _merged_from_adapter(base, load_file(folder / "adapter" /
                                                  "adapter_model.safetensors"))
    for name, W in saved.items():
        if name in merged:
            torch.testing.assert_close(W.double(), merged[name], rtol=0, atol=1e-6)
        else:
            assert torch.equal(W, base[name]), name
    ids = torch.tensor([[3, 17, 25, 9, 41, 5, 12]])
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(input_ids=ids)
        peft = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32),
            folder / "adapter")(input_ids=ids)
    torch.testing.assert_close(peft.logits, plain.logits, rtol=0, atol=1e-5)


def test_opd_with_lora_trains_the_adapter(ci_testbed, tmp_path):
    out = tmp_path / "opd"
    assert main(["opd", "--config", str(ROOT / "configs" / "opd_countdown_ci.yaml"), "--out",
                 str(out), "--no-progress", f"model={ci_testbed}",
                 f"algo.distill.teacher={ci_testbed}/teachers/strong", "steps=3",
                 "checkpoint_every=100", *LORA]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["grad/grad_norm"] > 0 for r in rows)
    adapter = load_file(out / "checkpoints" / "final" / "adapter" / "adapter_model.safetensors")
    assert any(float(t.abs().max()) > 0 for n, t in adapter.items() if "lora_B" in n)


@pytest.mark.slow
def test_opd_with_lora_lowers_the_students_exact_kl_to_the_teacher(ci_testbed, tmp_path):
    """The teacher is the student with seeded noise on its weights (as in
    test_grpo_trainer's OPD direction test); an adapter on every linear layer moves the
    student's exact reverse KL to it, on fixed greedy sequences, down."""
    from test_grpo_trainer import _eval_prompts, _exact_kl, _greedy_sequences, _perturbed_copy

    teacher = _perturbed_copy(ci_testbed, tmp_path / "teacher", 0.05)
    out = tmp_path / "opd"
    assert main(["opd", "--config", str(ROOT / "configs" / "opd_countdown_ci.yaml"), "--out",
                 str(out), "--no-progress", f"model={ci_testbed}",
                 f"algo.distill.teacher={teacher}", "steps=12", "rollout.max_tokens=32",
                 "checkpoint_every=100", "optim.lr=3e-3", "lora.enabled=true", "lora.rank=8",
                 "lora.alpha=16", "lora.target_modules=[all-linear]"]) == 0
    sequences = _greedy_sequences(ci_testbed, _eval_prompts(ci_testbed))
    before = _exact_kl(ci_testbed, teacher, sequences)
    after = _exact_kl(out / "checkpoints" / "final", teacher, sequences)
    print(before, after)
    assert after < 0.9 * before, (before, after)


@pytest.mark.parametrize("override,message", [
    ("lora.target_modules=[nope_proj]", "has no linear layer called"),
    ("lora.rank=0", "lora.rank must be an integer >= 1"),
    ("lora.rank=100000", "is above the rank of"),
    ("lora.dropout=0.1", "set lora.dropout=0"),
])
def test_bad_lora_input_exits_2_and_writes_nothing(ci_testbed, tmp_path, capsys, override,
                                                   message):
    out = tmp_path / "run"
    assert main(["grpo", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}", "lora.enabled=true", override]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()


def test_lora_with_a_diffusion_policy_exits_2(ci_diffusion, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["grpo", "--config", str(ROOT / "configs" / "dllm_d1_countdown_ci.yaml"),
                 "--out", str(out), "--no-progress", f"model={ci_diffusion / 'diffusion'}",
                 "lora.enabled=true"]) == 2
    assert "masked-diffusion model; lora.enabled" in capsys.readouterr().err
    assert not out.exists()
