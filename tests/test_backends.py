"""The generation backends: the factory's choice and device check, and the two engines
taking the same parameters to the same outputs."""

from __future__ import annotations

import pytest
import torch

from es_llm.backends import BackendSpec, choose_backend, make_backend
from es_llm.backends import factory
from es_llm.backends.base import SamplingParams
from es_llm.backends.hf import nucleus_sample
from es_llm.errors import BadInput
from es_llm.io import SAMPLING_FILE, read_jsonl
from es_llm.runtime import Runtime


def eval_prompts(testbed, k=24):
    rows = read_jsonl(testbed / "data" / "countdown_eval.jsonl")
    return [r["prompt"] for r in rows[:k]]


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    # probs = [0.5, 0.3, 0.15, 0.05]; top_p = 0.7 keeps {0.5, 0.3} (mass before 0.15 is 0.8).
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    g = torch.Generator().manual_seed(0)
    draws = nucleus_sample(logits, 1.0, 0.7, g)
    assert set(draws.tolist()) == {0, 1}
    # Renormalised: token 0 has probability 0.5 / 0.8 = 0.625.
    assert abs((draws == 0).float().mean().item() - 0.625) < 0.03
    assert nucleus_sample(logits[:1], 0.0, 1.0, g).item() == 0


def test_sampling_params_are_validated():
    with pytest.raises(BadInput, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(BadInput, match="top_p"):
        SamplingParams(top_p=0)


ROWS = "engine.serve=rows runs the population inside the HF decoding loop"


@pytest.fixture
def folders(tmp_path):
    """A causal and a masked-diffusion model folder, as far as the choice reads them."""
    causal, diffusion = tmp_path / "causal", tmp_path / "diffusion"
    causal.mkdir()
    diffusion.mkdir()
    (diffusion / SAMPLING_FILE).write_text("{}")
    return {"causal": str(causal), "diffusion": str(diffusion), "memory": None}


# (folder, setting, vLLM installed, hf-only reason) -> the backend, or a fragment of the refusal.
CHOICES = [
    ("causal", "auto", True, None, "vllm"),
    ("causal", "auto", False, None, "hf"),
    ("causal", "hf", True, None, "hf"),
    ("causal", "vllm", True, None, "vllm"),
    ("causal", "vllm", False, None, "vLLM is not installed"),
    ("causal", "auto", True, ROWS, "hf"),
    ("causal", "vllm", True, ROWS, ROWS),
    ("diffusion", "auto", True, None, "diffusion"),
    ("diffusion", "hf", False, None, "diffusion"),
    ("diffusion", "vllm", True, None, "masked-diffusion model, which the vllm backend"),
    ("diffusion", "auto", True, ROWS, ROWS),
    ("memory", "auto", True, None, "hf"),
    ("memory", "vllm", True, None, "loads a model folder"),
    ("causal", "tpu", True, None, "valid choices are: auto, hf, vllm"),
]


@pytest.mark.parametrize("folder, name, installed, hf_only, expected", CHOICES)
def test_the_factory_chooses_by_the_model_and_the_setting(folders, monkeypatch, folder, name,
                                                          installed, hf_only, expected):
    monkeypatch.setattr(factory, "vllm_available", lambda: installed)
    spec = BackendSpec(folders[folder], backend=name, hf_only=hf_only, model=object())
    if expected in ("vllm", "hf", "diffusion"):
        assert spec.choice() == expected
        assert choose_backend(name, folders[folder], hf_only) == expected
    else:
        with pytest.raises(BadInput, match=expected):
            spec.choice()


def test_the_factory_refuses_a_missing_cuda_device_before_building(ci_testbed, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BadInput, match="device 'cuda' was asked for but torch sees no CUDA "
                                       "device; use runtime.device=cpu"):
        make_backend(BackendSpec(str(ci_testbed), backend="hf",
                                 runtime=Runtime(device="cuda")))


def test_the_cuda_refusal_is_written_once():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    holders = sorted(str(p.relative_to(root)) for d in ("es_llm", "gradient", "scripts")
                     for p in (root / d).rglob("*.py") if "sees no CUDA device" in p.read_text())
    assert holders == ["es_llm/backends/factory.py"]


def test_the_factory_serves_a_loaded_model_as_it_is(ci_testbed):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    backend = make_backend(BackendSpec(str(ci_testbed), backend="hf", model=model, tokenizer=tok,
                                       batch_size=7))
    assert backend.name == "hf" and backend.model is model and backend.batch_size == 7


def test_hf_sampling_is_reproducible_from_the_seed(hf_engine, ci_testbed):
    prompts = eval_prompts(ci_testbed, 6)
    p = SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=7)
    a = hf_engine.generate(prompts, p)
    b = hf_engine.generate(prompts, p)
    c = hf_engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=8))
    texts = lambda out: [x.text for row in out for x in row]  # noqa: E731
    assert texts(a) == texts(b)
    assert texts(a) != texts(c)
    assert all(len(row) == 4 for row in a)


@pytest.mark.parametrize("kv_cache", ["static", pytest.param("compiled", marks=pytest.mark.slow)])
def test_static_and_compiled_decoding_give_the_dynamic_loops_greedy_ids(hf_engine, ci_testbed,
                                                                        kv_cache):
    """Through runtime.kv_cache; 24 prompts in batches of 16 and 8, twice, so a cache is
    built per batch shape and reused (reset) by the second call."""
    prompts = eval_prompts(ci_testbed, 24)
    p = SamplingParams(n=1, temperature=0, max_tokens=48, logprobs=True)
    backend = make_backend(BackendSpec(str(ci_testbed), backend="hf", batch_size=16,
                                       runtime=Runtime(kv_cache=kv_cache)))
    assert backend.kv_cache == kv_cache
    dynamic = [row[0] for row in hf_engine.generate(prompts, p)]
    for _ in range(2):
        other = [row[0] for row in backend.generate(prompts, p)]
        assert [c.token_ids for c in other] == [c.token_ids for c in dynamic]
        # Attention over the longer preallocated cache rounds differently, not by more.
        assert all(a == pytest.approx(b, abs=1e-4) for c, d in zip(other, dynamic)
                   for a, b in zip(c.logprobs, d.logprobs))


def test_an_unknown_kv_cache_is_refused():
    with pytest.raises(BadInput, match="runtime.kv_cache"):
        Runtime(kv_cache="paged")


def test_hf_stop_strings_and_logprobs(hf_engine, ci_testbed):
    prompts = eval_prompts(ci_testbed, 4)
    full = hf_engine.generate(prompts, SamplingParams(n=1, temperature=0, max_tokens=48,
                                                      logprobs=True))
    cut = hf_engine.generate(prompts, SamplingParams(n=1, temperature=0, max_tokens=48,
                                                     stop=("<answer>",)))
    for f, c in zip(full, cut):
        f, c = f[0], c[0]
        assert len(f.logprobs) == len(f.token_ids)
        assert all(lp <= 0 for lp in f.logprobs)
        if "<answer>" in f.text:
            assert c.text == f.text[:f.text.index("<answer>")]
            assert c.finish_reason == "stop"


@pytest.mark.vllm
def test_greedy_completions_match_across_backends(hf_engine, vllm_engine, ci_testbed):
    prompts = eval_prompts(ci_testbed, 60)
    p = SamplingParams(n=1, temperature=0, max_tokens=64, logprobs=True)
    hf = hf_engine.generate(prompts, p)
    vl = vllm_engine.generate(prompts, p)
    assert [r[0].text for r in hf] == [r[0].text for r in vl]
    assert [r[0].token_ids for r in hf] == [r[0].token_ids for r in vl]
    # Same quantity (unscaled log-softmax) from both, up to float32 kernel differences.
    diffs = [abs(a - b) for h, v in zip(hf, vl) for a, b in zip(h[0].logprobs, v[0].logprobs)]
    assert max(diffs) < 1e-3


@pytest.mark.vllm
def test_vllm_sampling_is_reproducible_from_the_seed(vllm_engine, ci_testbed):
    prompts = eval_prompts(ci_testbed, 8)
    p = SamplingParams(n=4, temperature=1.0, max_tokens=32, seed=3)
    a = vllm_engine.generate(prompts, p)
    b = vllm_engine.generate(prompts, p)
    assert [x.text for row in a for x in row] == [x.text for row in b for x in row]
    assert len({x.text for row in a for x in row}) > len(prompts)  # samples differ


def test_stream_seeds_depend_on_seed_key_and_occurrence_only():
    from es_llm.backends.base import stream_seeds

    a = stream_seeds(5, 3, ["p1", "p2", "p1"])
    # A repeated key gets a stream of its own; the first occurrence keeps the key's stream
    # when other keys join or leave the call.
    assert len(set(a)) == 3
    assert stream_seeds(5, 2, ["p9", "p1"])[1] == a[0]
    assert stream_seeds(5, 1, ["p2"]) == [a[1]]
    assert stream_seeds(6, 3, ["p1", "p2", "p1"]) != a
    assert stream_seeds(5, 3) == stream_seeds(5, 3, [0, 1, 2])
    assert all(0 <= s < 2 ** 62 for s in a)
    with pytest.raises(ValueError):
        stream_seeds(5, 2, ["p1"])


@pytest.mark.vllm
def test_vllm_requests_draw_independent_streams(vllm_engine, ci_testbed):
    """Every prompt of a call has its own random stream, keyed by (seed, problem): copies of
    one prompt differ, a problem's samples do not change when other problems join the call,
    and a rerun is identical."""
    prompts = eval_prompts(ci_testbed, 4)
    p = SamplingParams(n=2, temperature=1.0, max_tokens=32, seed=11)
    texts = lambda row: [c.text for c in row]  # noqa: E731
    copies = vllm_engine.generate([prompts[0]] * 3, p, keys=["a", "a", "a"])
    assert len({tuple(texts(row)) for row in copies}) == 3
    alone = vllm_engine.generate([prompts[1]], p, keys=["q1"])
    crowd = vllm_engine.generate(prompts, p, keys=["q0", "q1", "q2", "q3"])
    again = vllm_engine.generate(prompts, p, keys=["q0", "q1", "q2", "q3"])
    assert texts(crowd[1]) == texts(alone[0])
    assert [texts(r) for r in crowd] == [texts(r) for r in again]
    # Without keys a prompt's stream is its position: copies still differ.
    unkeyed = vllm_engine.generate([prompts[0]] * 3, p)
    assert len({tuple(texts(row)) for row in unkeyed}) == 3
