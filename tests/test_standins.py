"""Five architectures under test: random-init stand-ins of Qwen2, Qwen3, Llama, Mistral and
Gemma (es_llm/testbed/standins.py) through both backends, ES in both serve modes, MPI, the
GRPO weight push and bf16; and completions decoded the same way on HF and vLLM."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from es_llm.backends.base import SamplingParams, completion_text
from es_llm.backends.hf import HFBackend
from es_llm.backends.lowrank_rows import RowAdapters
from es_llm.errors import BadInput
from es_llm.es.weights import ModuleWeights
from es_llm.io import read_jsonl
from es_llm.runtime import Runtime
from es_llm.testbed.standins import (ARCHITECTURES, SHAPES, build_standin, model_config,
                                     train_tokenizer)
from populations import lowrank
from populations.perturbations import KindInput, perturbation

ROOT = Path(__file__).resolve().parents[1]
ARCHS = list(ARCHITECTURES)
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
# A random-init model's two best tokens can be this close in log-prob; float32 kernels of HF
# and vLLM (or written weights and row terms) may then pick either, so greedy paths may part
# there and only there.
NEAR_TIE = 1e-3

# What makes each architecture itself, as parameter names of its checkpoint.
LAYOUT = {
    "qwen2": (["self_attn.q_proj.bias", "self_attn.k_proj.bias"], ["lm_head", "q_norm"]),
    "qwen3": (["self_attn.q_norm.weight", "self_attn.k_norm.weight"], ["lm_head", "q_proj.bias"]),
    "llama": (["lm_head.weight"], ["q_norm", "q_proj.bias"]),
    "mistral": (["lm_head.weight"], ["q_norm", "q_proj.bias"]),
    "gemma": (["input_layernorm.weight"], ["lm_head", "q_norm", "q_proj.bias"]),
}


def tensor_names(folder: Path) -> list[str]:
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return list(f.keys())


@pytest.mark.parametrize("arch", ARCHS)
def test_each_standin_has_its_architectures_layout(standin, arch):
    folder = standin(arch)
    names = tensor_names(folder)
    present, absent = LAYOUT[arch]
    assert all(any(n.endswith(p) for n in names) for p in present), names
    assert not any(a in n for a in absent for n in names)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == arch and config["num_hidden_layers"] == 2
    assert sorted(p.name for p in (folder / "data").iterdir()) == \
        ["countdown_eval.jsonl", "countdown_rl.jsonl"]
    if arch == "gemma":  # (1 + w) norms start at w = 0
        with safe_open(folder / "model.safetensors", framework="pt") as f:
            assert f.get_tensor("model.norm.weight").abs().max() == 0


def test_a_standin_is_the_same_for_a_seed_and_another_for_another(tmp_path):
    a = build_standin("llama", "ci", tmp_path / "a", seed=3)
    b = build_standin("llama", "ci", tmp_path / "b", seed=3)
    c = build_standin("llama", "ci", tmp_path / "c", seed=4)
    files = ["model.safetensors", "tokenizer.json", "data/countdown_rl.jsonl"]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert all((a / f).read_bytes() != (c / f).read_bytes() for f in files)


# Qwen2.5-0.5B: 0.49 B parameters; Qwen2.5-1.5B: 1.54 B (1.31 B without the tied embedding).
@pytest.mark.parametrize("shape, count", [("qwen2.5-0.5b", 494_032_768),
                                          ("qwen2.5-1.5b", 1_543_714_304)])
def test_the_qwen2_5_shapes_have_their_parameter_counts(shape, count):
    tok = train_tokenizer(["nums 4 1 make 4"], 300)
    config = model_config("qwen2", shape, tok)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == count
    assert config.tie_word_embeddings and config.vocab_size == 151936
    assert all(s.head_dim * s.num_heads == s.hidden_size for s in SHAPES.values())


@pytest.mark.parametrize("arch, shape, dtype, message", [
    ("gpt2", "ci", "float32", "unknown stand-in architecture 'gpt2'; valid choices are: qwen2, "
                              "qwen3, llama, mistral, gemma"),
    ("llama", "7b", "float32", "unknown stand-in shape '7b'; valid choices are: ci, qwen2.5-0.5b, "
                       "qwen2.5-1.5b"),
    ("llama", "ci", "int8", "unknown stand-in dtype 'int8'; valid choices are: float32, "
                            "bfloat16, float16"),
])
def test_a_bad_standin_name_is_refused_with_the_choices(tmp_path, arch, shape, dtype, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        build_standin(arch, shape, tmp_path / "never", dtype=dtype)
    assert not (tmp_path / "never").exists()


def test_the_chat_template_renders_chatml_with_the_thinking_switch(standin):
    tok = AutoTokenizer.from_pretrained(standin("qwen3"))
    chat = [{"role": "user", "content": "nums 4 1 make 4"}]
    plain = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>user\nnums 4 1 make 4<|im_end|>\n<|im_start|>assistant\n"
    off = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                  enable_thinking=False)
    assert off == plain + "<think>\n\n</think>\n\n"
    # The markers are single tokens.
    assert tok(plain).input_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


# --- the same text from the same ids on both backends ------------------------------------


def cut_arrow(tok) -> tuple[list[int], list[int]]:
    """Ids of "ab→": the whole of them, and cut after the arrow's first byte token."""
    ids = tok("ab→").input_ids
    # "→" is E2 86 92; the tokenizer never saw it, so it is three byte tokens.
    assert tok.decode(ids[-3:]) == "→" and len(ids) >= 4
    return ids, ids[:-2]


def test_a_completion_cut_inside_a_character_drops_the_partial_bytes(standin):
    tok = AutoTokenizer.from_pretrained(standin("llama"))
    whole, cut = cut_arrow(tok)
    assert tok.decode(cut) == "ab\ufffd"  # what a plain decode stores
    assert completion_text(tok, cut) == "ab"
    assert completion_text(tok, whole) == "ab→"
    assert completion_text(tok, whole + [tok.eos_token_id]) == "ab→"
    assert completion_text(tok, whole, stop=("b",)) == "a"


def test_both_backends_write_the_text_of_a_cut_completion_the_same_way(standin):
    from es_llm.backends.vllm_backend import VLLMBackend

    pytest.importorskip("vllm")
    folder = standin("llama")
    tok = AutoTokenizer.from_pretrained(folder)
    _, cut = cut_arrow(tok)
    params = SamplingParams(n=1, temperature=0, max_tokens=len(cut))
    hf = HFBackend(str(folder), tokenizer=tok)
    from_hf = hf._finish(list(cut), None, "length", params).text
    # vLLM's own output object for these ids, whose incremental text is not what we store.
    engine = SimpleNamespace(generate=lambda *a, **k: [SimpleNamespace(outputs=[SimpleNamespace(
        text="vLLM's text", token_ids=list(cut), logprobs=None, finish_reason="length")])])
    vl = object.__new__(VLLMBackend)
    vl.llm, vl.tokenizer, vl.logprobs_mode, vl.lora_request = engine, tok, "raw", None
    from_vllm = vl.generate(["ab"], params)[0][0].text
    assert from_hf == from_vllm == "ab"


# --- low-rank ES: member terms in rows equal written weights (HF) --------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_a_context_too_short_for_the_prompts_is_refused_at_load(standin, arch):
    """The longest prompt plus max_tokens must fit the model's context (the stand-ins' own
    is 2,048 positions), counted in each architecture's own tokens."""
    from es_llm.runtime import check_context

    folder = standin(arch)
    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [r["prompt"] for r in read_jsonl(folder / "data" / "countdown_rl.jsonl")]
    longest = max(len(tok(p).input_ids) for p in prompts)
    check_context(folder, tok, prompts, 2048 - longest, Runtime())
    with pytest.raises(BadInput, match=f"longest prompt is {longest} tokens"):
        check_context(folder, tok, prompts, 2049 - longest, Runtime())


def test_es_refuses_a_context_too_short_before_writing(standin, tmp_path):
    folder = standin("qwen2")
    tok = AutoTokenizer.from_pretrained(folder)
    longest = max(len(tok(r["prompt"]).input_ids)
                  for r in read_jsonl(folder / "data" / "countdown_rl.jsonl"))
    done = es_cli(folder, tmp_path / "run", f"runtime.max_model_len={longest + 15}",
                  "max_tokens=16")
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{longest + 16} in all, but runtime.max_model_len is {longest + 15}" in done.stderr
    assert not (tmp_path / "run").exists()


def top_two_gap(model, ids: list[int]) -> float:
    """The log-prob margin of the model's best next token over its second best."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
    top = logp.topk(2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_equal_written_weights_for_a_lowrank_member(standin, arch):
    """Logits to float32 kernels, and greedy completions token for token: where the two
    ways part, the written model was at a near tie."""
    folder = standin(arch)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    backend = HFBackend(str(folder), model=model, tokenizer=tok)
    names = [n for n, _ in model.named_parameters()]
    rows = RowAdapters(model, names)
    rank, sigma, k = 2, 0.05, 4
    members = [(0, 1), (0, -1), (5, 1)]
    shapes = {n: p.shape for n, p in model.named_parameters()}
    factors = {(d, n): lowrank.factors(3, 1, d, n, shapes[n], rank)
               for d, _ in members for n in rows.matrices}
    A = {n: torch.stack([factors[d, n][0] * (s * sigma / math.sqrt(rank)) for d, s in members])
         for n in rows.matrices}
    B = {n: torch.stack([factors[d, n][1] for d, _ in members]) for n in rows.matrices}
    prompts = [r["prompt"] for r in read_jsonl(folder / "data" / "countdown_rl.jsonl")][:k]
    ids = tok(prompts[0], return_tensors="pt").input_ids
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=24)
    with torch.no_grad(), rows.members(A, B, k):
        logits_rows = model(input_ids=ids.repeat(len(members) * k, 1)).logits
        served = backend.generate([p for _ in members for p in prompts], greedy)
    pert = perturbation("lowrank", KindInput(3, 1, rank=rank))
    weights = ModuleWeights(model, names)
    with torch.no_grad():
        base = model(input_ids=ids).logits
    parted = []
    for i, (d, s) in enumerate(members):
        weights.perturb(lambda name, shape, d=d: pert.dense(d, name, shape), s, sigma)
        with torch.no_grad():
            written = model(input_ids=ids).logits
        written_ids = [c[0].token_ids for c in backend.generate(prompts, greedy)]
        for j in range(k):
            torch.testing.assert_close(logits_rows[i * k + j], written[0], atol=1e-4, rtol=1e-4)
            row_ids = served[i * k + j][0].token_ids
            if row_ids != written_ids[j]:
                at = next(t for t, (a, b) in enumerate(zip(row_ids, written_ids[j])) if a != b)
                prefix = tok(prompts[j]).input_ids + list(written_ids[j][:at])
                parted.append(top_two_gap(model, prefix))
        weights.restore()
        assert (written - base).abs().max() > 1e-2  # the member is not the base model
    assert all(g < NEAR_TIE for g in parted) and len(parted) <= 2, parted


# --- HF against vLLM, one engine per architecture in a process of its own -------------------


@pytest.fixture(scope="module")
def vllm_check(standin):
    """``vllm_check(arch)``: ``standin_vllm_check.py``'s result for that stand-in (run once)."""
    pytest.importorskip("vllm")
    done: dict[str, dict] = {}

    def get(arch: str) -> dict:
        if arch not in done:
            env = {**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
            proc = subprocess.run([sys.executable, str(ROOT / "tests" / "standin_vllm_check.py"),
                                   str(standin(arch))], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=300, check=False)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
            done[arch] = json.loads(lines[-1][len("RESULT "):])
        return done[arch]

    return get


def assert_same_greedy(check: dict, prompts: int = 20) -> None:
    """Greedy paths part only at a near tie of the HF model, and rarely; where the ids agree
    the texts do, and the logprobs of the common prefixes agree to float32 kernels."""
    parted = [g for g in check["gaps"] if g is not None]
    assert all(g < NEAR_TIE for g in parted), parted
    assert len(parted) <= prompts // 10, parted
    assert check["texts_equal"] >= prompts - len(parted)
    assert check["logprob_diff"] < 1e-3


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_hf_and_vllm_greedy_completions_agree(vllm_check, arch):
    result = vllm_check(arch)
    assert result["prompt_ids_equal"]
    assert_same_greedy(result["greedy"])


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_a_chat_rendered_prompt_feeds_both_engines_the_same_ids(vllm_check, arch):
    """task.chat renders through the folder's ChatML template once; HF's tokenizer and the
    engine's then feed the model the same ids."""
    result = vllm_check(arch)
    assert result["chat_rendered"] and result["chat_ids_equal"]


@pytest.mark.vllm
@pytest.mark.slow
def test_both_engines_store_a_completion_cut_inside_a_character_alike(vllm_check):
    """Random-init byte-level models end some greedy completions inside a multi-byte
    character at max_tokens (Llama's and Mistral's stand-ins six of 20 each); HF stored those
    with a trailing U+FFFD and vLLM without it before ``completion_text``."""
    cut = [pair for arch in ARCHS for pair in vllm_check(arch)["greedy"]["cut_texts"]]
    assert len(cut) >= 5
    assert all(hf == vl and not hf.endswith("\ufffd") for hf, vl in cut), cut


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_a_vllm_member_is_the_hf_weights_plus_the_same_noise_and_restores_bitwise(vllm_check,
                                                                                   arch):
    members = vllm_check(arch)["members"]
    families = {f for f in members if f != "restored_bitwise"}
    tied = ARCHITECTURES[arch].tie_word_embeddings
    assert {"embed", "qkv", "mlp_in", "out", "norms", "all"} <= families
    assert ("lm_head" in families) != tied
    assert ("qk_norm" in families) == (arch == "qwen3")
    for family in families:
        assert_same_greedy(members[family])
        # The family's noise changed the engine's greedy ids or moved its logprobs far
        # beyond the kernel differences (1e-6) the HF comparison allows for.
        assert members[family]["changed"] > 0 or members[family]["shift"] > 1e-3, \
            (family, members[family])
    assert members["restored_bitwise"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_a_pushed_policy_keeps_the_logprob_gap_under_1e_4(vllm_check, arch):
    push = vllm_check(arch)["push"]
    assert push["tokens"] > 300  # 8 prompts x 4 samples x up to 24 tokens
    assert push["mean"] < 1e-4 and push["max"] < 1e-3


# --- ES runs: MPI against one process, bf16 end to end -----------------------------------


def es_cli(folder: Path, out: Path, *args, ranks: int = 1) -> subprocess.CompletedProcess:
    prefix = []
    if ranks > 1:
        mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
        prefix = [mpirun, "-n", str(ranks)]
    return subprocess.run([*prefix, sys.executable, "-m", "es_llm", "es", "--no-progress",
                           "--config", str(ROOT / "configs" / "es_countdown_ci.yaml"),
                           "--out", str(out), f"model={folder}", "backend=hf", "iterations=2",
                           "checkpoint_every=100", *args],
                          capture_output=True, text=True, env=ENV, timeout=600)


@pytest.mark.mpi
@pytest.mark.slow
def test_mpirun_two_ranks_gives_bitwise_the_one_process_run(standin, tmp_path):
    """On Qwen2 (q/k/v biases, tied head), the shape of the GPU check's model."""
    one = es_cli(standin("qwen2"), tmp_path / "one")
    two = es_cli(standin("qwen2"), tmp_path / "two", ranks=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    assert read_jsonl(tmp_path / "one" / "ledger.jsonl") == \
        read_jsonl(tmp_path / "two" / "ledger.jsonl")
    final = "checkpoints/final/model.safetensors"
    assert (tmp_path / "one" / final).read_bytes() == (tmp_path / "two" / final).read_bytes()


@pytest.mark.slow
def test_bf16_es_and_sampling_run_end_to_end(standin, tmp_path):
    """Gemma, whose (1 + w) norms and scaled embedding are the most for bf16 to get wrong."""
    from es_llm.backends import BackendSpec, make_backend

    done = es_cli(standin("gemma"), tmp_path / "run", "runtime.dtype=bfloat16",
                  "prompts_per_iteration=4", "max_tokens=16")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(metrics) == 2
    assert all(math.isfinite(v) for m in metrics for v in m.values()
               if isinstance(v, float)), metrics
    final = tmp_path / "run" / "checkpoints" / "final"
    with safe_open(final / "model.safetensors", framework="pt") as f:
        assert {f.get_tensor(n).dtype for n in f.keys()} == {torch.bfloat16}
    backend = make_backend(BackendSpec(str(final), backend="hf",
                                       runtime=Runtime(dtype="bfloat16")))
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    prompts = [r["prompt"] for r in read_jsonl(final / "data" / "countdown_eval.jsonl")][:8]
    out = backend.generate(prompts, SamplingParams(n=2, max_tokens=16, seed=1, logprobs=True))
    lps = [lp for row in out for c in row for lp in c.logprobs]
    assert len(lps) > 8 * 2 and all(math.isfinite(lp) and lp <= 0 for lp in lps)


# --- scripts/gpu_check.sh rehearsed on the CPU ---------------------------------------------


@pytest.mark.slow
def test_the_gpu_check_times_every_stage_and_passes_the_runtime_on(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu",
                           "--shape", "ci", "--dtype", "float32", "--skip-tests", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900,
                          env={**ENV, "ES_LLM_PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1  # the JSON is all of stdout
    report = json.loads(lines[0])
    assert list(report["stages"]) == ["es_full", "es_rows", "grpo", "compare"]
    for name, stage in report["stages"].items():
        assert stage["returncode"] == 0 and math.isfinite(stage["seconds"]), (name, stage)
        assert stage["seconds"] > 0 and stage["peak_gpu_bytes"] is None  # no CUDA here
    runs = tmp_path / "runs"
    for name in ("es_full", "es_rows", "grpo", "compare"):
        runtime = yaml.safe_load((runs / name / "config.yaml").read_text())["runtime"]
        assert (runtime["device"], runtime["dtype"]) == ("cpu", "float32"), name
    for name in ("es_full", "es_rows"):
        assert len(read_jsonl(runs / name / "ledger.jsonl")) == 2
    assert "kind: lowrank" in (runs / "es_rows" / "config.yaml").read_text()
    comparison = json.loads((runs / "compare" / "comparison.json").read_text())
    assert len(comparison["problem_ids"]) == 50
    # ES throughput beside plain batched generation, on the ci-shaped model.
    throughput = report["throughput"]["ci"]
    assert throughput["returncode"] == 0, throughput["stderr_tail"]
    for name, population in [("full_rank", 4), ("rows_n256", 256), ("rows_n4096", 4096)]:
        setting = throughput[name]
        assert setting["population"] == population
        for side in ("plain", "es"):
            figures = setting[side]
            assert figures["samples"] == setting["plain"]["samples"] > 0, (name, side)
            rates = ("tokens", "seconds", "samples_per_s", "tokens_per_s")
            assert all(figures[k] > 0 and math.isfinite(figures[k]) for k in rates), (name, side)
            assert figures["peak_gpu_bytes"] is None
