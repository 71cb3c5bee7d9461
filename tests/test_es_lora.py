"""ES over a LoRA adapter on the ci testbed: a member is served as its merged factors and
restored bitwise, rows serve the same members as written weights, vLLM serves the same model
as transformers, `mpirun -n 2` and SIGKILL + resume reproduce one process bitwise, the
checkpoint's adapter loads in PEFT and equals the merged model, bad settings exit 2, and a
dense reward rises."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from es_llm.adapters import LoraSettings, factor_names, init_factors, target_linears
from es_llm.backends.base import SamplingParams
from es_llm.backends.hf import HFBackend
from es_llm.backends.lowrank_rows import RowAdapters
from es_llm.cli import main
from es_llm.comm.serial import SerialComm
from es_llm.es.config import EngineSettings, ESRunConfig
from es_llm.es.engine import run
from es_llm.es.setup import adapter_seed, build_edges
from es_llm.es.weights import AdapterWeights
from es_llm.io import read_jsonl
from es_llm.models import resolve_training_data
from es_llm.tasks import TaskConfig
from populations.es import ESConfig
from populations.noise import keyed_noise

from test_es_direction import greedy_reward, sevens_task  # noqa: F401 (a fixture)
from test_es_lowrank import es_cli, final_weights, prompts

ROOT = Path(__file__).resolve().parents[1]
LORA = ROOT / "configs" / "es_lora_countdown.yaml"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
LORA_SETTINGS = LoraSettings(enabled=True, rank=4, alpha=8.0)
# The shipped config scaled to the ci testbed: 8 members on 4 prompts, 3 iterations; the ci
# model almost never solves a problem, so half the reward is for a well-formed answer.
SMALL = ["backend=hf", "iterations=3", "es.population=8", "prompts_per_iteration=4",
         "max_tokens=32", "checkpoint_every=2", "checksum_every=1", "es.sigma=0.05",
         "es.lr=0.01", "task.format_weight=0.5"]


def adapter_weights(model, lora=LORA_SETTINGS, seed=0) -> AdapterWeights:
    linears = target_linears(model, lora)
    return AdapterWeights(linears, init_factors(linears, lora, seed), lora)


def member_noise(direction: int):
    eps = keyed_noise(run_seed=0, iteration=0)
    return lambda name, shape: eps(direction, name, shape)


def test_a_member_is_served_merged_and_restore_is_bitwise(ci_testbed):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.bfloat16)
    weights = adapter_weights(model)
    # A master with B != 0, so the merged master differs from the base.
    weights.set_master({n: t + 0.1 * torch.randn(t.shape, generator=torch.Generator().manual_seed(1))
                        for n, t in weights.master.items()})
    served = {n: p.detach().clone() for n, p in model.named_parameters()}
    sigma, scale = 0.05, LORA_SETTINGS.scale
    weights.perturb(member_noise(2), -1, sigma)
    after = dict(model.named_parameters())
    for module in target_linears(model, LORA_SETTINGS):
        a_name, b_name = factor_names(module)
        A = weights.master[a_name] - sigma * member_noise(2)(a_name, weights.master[a_name].shape)
        B = weights.master[b_name] - sigma * member_noise(2)(b_name, weights.master[b_name].shape)
        want = (weights.base[f"{module}.weight"] + scale * (B @ A)).to(torch.bfloat16)
        assert torch.equal(after[f"{module}.weight"], want)
        assert not torch.equal(want, served[f"{module}.weight"])
    for name, p in after.items():
        if name not in weights.params:
            assert torch.equal(p, served[name]), name  # non-target weights never change
    weights.restore()
    assert all(torch.equal(p, served[n]) for n, p in model.named_parameters())


def test_rows_serve_a_member_as_its_written_weights(ci_testbed):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    backend = HFBackend(str(ci_testbed), model=model, tokenizer=tok)
    weights = adapter_weights(model)
    rows = RowAdapters(model, list(weights.params))
    members = [(0, 1), (0, -1), (5, 1)]
    sigma, k = 0.3, 2
    texts = prompts(ci_testbed, k)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=32)
    base = backend.generate(texts, params)
    A, B = weights.row_terms([weights.member_factors(member_noise(d), s, sigma)
                              for d, s in members])
    weights.serve_base()
    with torch.no_grad(), rows.members(A, B, k):
        served = backend.generate([p for _ in members for p in texts], params)
    differs = 0
    for i, (d, s) in enumerate(members):
        weights.perturb(member_noise(d), s, sigma)
        written = backend.generate(texts, params)
        weights.restore()
        for j in range(k):
            assert served[i * k + j][0].token_ids == written[j][0].token_ids
            differs += written[j][0].token_ids != base[j][0].token_ids
    assert differs > 0  # the members write something else than the base model


@pytest.mark.vllm
def test_vllm_serves_the_same_adapter_member_as_transformers(ci_testbed, vllm_engine):
    from es_llm.backends.vllm_weights import VLLMWeights

    tok = AutoTokenizer.from_pretrained(ci_testbed)
    hf_model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    hf_w = adapter_weights(hf_model)
    hf = HFBackend(str(ci_testbed), model=hf_model, tokenizer=tok)
    vl_w = VLLMWeights(vllm_engine.llm,
                       adapter_weights(AutoModelForCausalLM.from_pretrained(ci_testbed)))
    texts = [r["prompt"] for r in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")][:20]
    params = SamplingParams(n=1, temperature=0, max_tokens=32)
    base = vllm_engine.generate(texts, params)
    try:
        hf_w.perturb(member_noise(3), 1, 0.3)
        vl_w.perturb(member_noise(3), 1, 0.3)
        a, b = hf.generate(texts, params), vllm_engine.generate(texts, params)
    finally:
        vl_w.restore()  # B = 0: the shared engine is back at the base weights
    assert [r[0].text for r in a] == [r[0].text for r in b]
    assert any(x[0].text != y[0].text for x, y in zip(b, base))


@pytest.fixture(scope="module")
def serial_run(ci_testbed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lora") / "run"
    done = es_cli("--config", str(LORA), "--out", str(out), f"model={ci_testbed}", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_checkpoint_adapter_loads_in_peft_and_equals_the_merged_model(serial_run,
                                                                          ci_testbed):
    from peft import PeftModel

    final = serial_run / "checkpoints" / "final"
    assert (serial_run / "checkpoints" / "step_2" / "adapter" / "adapter_config.json").is_file()
    config = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(ci_testbed) and config["r"] == 8
    base = load_file(ci_testbed / "model.safetensors")
    merged = load_file(final / "model.safetensors")
    changed = {n for n in base if not torch.equal(base[n], merged[n])}
    # Only target-module weights moved, and the run moved them.
    assert changed and all(n.rpartition(".")[0].rpartition(".")[2] in
                           ("q_proj", "k_proj", "v_proj", "o_proj") for n in changed)
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ci_testbed),
                                     final / "adapter").eval()
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    ids = AutoTokenizer.from_pretrained(final)(prompts(ci_testbed, 1)[0],
                                               return_tensors="pt").input_ids
    with torch.no_grad():
        assert (peft(input_ids=ids).logits - model(input_ids=ids).logits).abs().max() < 1e-4


@pytest.mark.slow
def test_rows_and_written_weights_give_the_same_adapter_run(ci_testbed, tmp_path, serial_run):
    out = tmp_path / "rows"
    done = es_cli("--config", str(LORA), "--out", str(out), f"model={ci_testbed}", *SMALL,
                  "engine.serve=rows", "engine.members_per_call=4")
    assert done.returncode == 0, done.stderr[-3000:]
    # The same greedy texts, so the same rewards: the two servings are one population.
    assert read_jsonl(out / "ledger.jsonl") == read_jsonl(serial_run / "ledger.jsonl")
    assert (out / "checkpoints" / "final" / "adapter").is_dir()


@pytest.mark.mpi
@pytest.mark.slow
def test_adapter_mpirun_two_ranks_gives_bitwise_the_serial_run(ci_testbed, tmp_path,
                                                               serial_run):
    two = es_cli("--config", str(LORA), "--out", str(tmp_path / "two"), f"model={ci_testbed}",
                 *SMALL, ranks=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert read_jsonl(tmp_path / "two" / "ledger.jsonl") == read_jsonl(serial_run / "ledger.jsonl")
    assert final_weights(tmp_path / "two") == final_weights(serial_run)
    adapter = Path("checkpoints/final/adapter/adapter_model.safetensors")
    assert (tmp_path / "two" / adapter).read_bytes() == (serial_run / adapter).read_bytes()


@pytest.mark.slow
def test_adapter_resume_after_sigkill_is_bitwise(ci_testbed, tmp_path):
    common = ["--config", str(LORA), f"model={ci_testbed}", *SMALL, "iterations=8",
              "checkpoint_every=100", "es.optimizer=adam"]
    assert es_cli("--out", str(tmp_path / "full"), *common).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "es_llm", "es", "--no-progress", "--out",
                             str(tmp_path / "killed"), *common], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = tmp_path / "killed" / "ledger.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ledger.is_file() and len(ledger.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 3 <= len(read_jsonl(ledger)) < 8, "the run should have been killed part-way"
    assert main(["es", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0
    assert final_weights(tmp_path / "full") == final_weights(tmp_path / "killed")
    assert read_jsonl(ledger) == read_jsonl(tmp_path / "full" / "ledger.jsonl")


def test_the_adapter_starts_from_a_pure_function_of_the_run_seed():
    assert adapter_seed(0) == adapter_seed(0) != adapter_seed(1)
    assert adapter_seed(0) >= 0


@pytest.mark.slow
def test_adapter_es_raises_a_dense_reward_on_the_ci_testbed(ci_testbed, tmp_path, sevens_task):
    cfg = ESRunConfig(model=str(ci_testbed),
                      task=TaskConfig(name="sevens",
                                      data=str(ci_testbed / "data" / "countdown_rl.jsonl")),
                      es=ESConfig(population=16, sigma=0.1, lr=0.1, antithetic=True),
                      engine=EngineSettings(), lora=replace(LORA_SETTINGS, rank=8, alpha=16.0),
                      iterations=10, prompts_per_iteration=32, max_tokens=32, backend="hf",
                      checkpoint_every=100)
    edges, problems = build_edges(resolve_training_data(cfg), SerialComm())
    held = problems[:64]
    before = greedy_reward(edges, held)
    run(cfg, edges, problems, tmp_path / "run", progress=False)
    after = greedy_reward(edges, held)
    print(f"greedy reward before {before:.3f} after {after:.3f}")
    assert after > before + 0.05, (before, after)


@pytest.mark.parametrize("override, message", [
    ("es.kind=lowrank", "es.kind=lowrank is EGGROLL"),
    ("engine.params=matrices", "the adapter decides what evolves"),
    ("engine.params=regex engine.param_pattern=mlp", "the adapter decides what evolves"),
    ("lora.target_modules=[w_proj]", "names w_proj, which this model"),
    ("lora.rank=0", "lora.rank must be an integer >= 1"),
    ("backend=vllm lora.target_modules=[q_proj,v_proj]", "but not k_proj"),
    ("engine.serve=rows backend=vllm", "engine.serve=rows runs the population inside the HF"),
])
def test_adapter_bad_settings_exit_2(ci_testbed, tmp_path, capsys, override, message):
    code = main(["es", "--config", str(LORA), "--out", str(tmp_path / "never"),
                 f"model={ci_testbed}", *SMALL, *override.split()])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()
