"""Perturbations written into vLLM's fused layout give the same model as in transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from es_llm.backends.base import SamplingParams
from es_llm.backends.hf import HFBackend
from es_llm.backends.vllm_weights import vllm_target
from es_llm.es.weights import ModuleWeights, select_parameters
from es_llm.io import read_jsonl
from populations.noise import keyed_noise

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def test_hf_names_map_to_fused_vllm_slots():
    assert vllm_target("model.layers.3.self_attn.k_proj.weight", PACKED) == \
        ("model.layers.3.self_attn.qkv_proj.weight", 1, 3)
    assert vllm_target("model.layers.0.mlp.up_proj.weight", PACKED) == \
        ("model.layers.0.mlp.gate_up_proj.weight", 1, 2)
    assert vllm_target("model.norm.weight", PACKED) == ("model.norm.weight", 0, 1)


@pytest.fixture(scope="module")
def es_engines(ci_testbed, vllm_engine):
    from es_llm.backends.vllm_weights import VLLMWeights

    tok = AutoTokenizer.from_pretrained(ci_testbed)
    hf_model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    hf_w = ModuleWeights(hf_model, select_parameters(hf_model, "all"))
    hf = HFBackend(str(ci_testbed), model=hf_model, tokenizer=tok)
    shadow = AutoModelForCausalLM.from_pretrained(ci_testbed)
    vl_w = VLLMWeights(vllm_engine.llm, ModuleWeights(shadow, select_parameters(shadow, "all")))
    yield hf, hf_w, vllm_engine, vl_w
    vl_w.restore()  # leave the shared engine at the base weights


@pytest.mark.vllm
@pytest.mark.parametrize("pattern", [r"embed", r"(q|k|v)_proj", r"(gate|up)_proj",
                                     r"o_proj|down_proj|norm", r"."])
def test_same_noise_gives_the_same_model_in_both_backends(es_engines, ci_testbed, pattern):
    import re

    hf, hf_w, vl, vl_w = es_engines
    prompts = [r["prompt"] for r in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")][:40]
    params = SamplingParams(n=1, temperature=0, max_tokens=48, logprobs=True)
    base = vl.generate(prompts, params)
    eps = keyed_noise(run_seed=0, iteration=0)

    def noise(name, shape):  # member with direction 3, sign -1, on the selected tensors
        return -eps(3, name, shape) if re.search(pattern, name) else torch.zeros(shape)

    hf_w.perturb(noise, +1, 0.05)
    vl_w.perturb(noise, +1, 0.05)
    try:
        a, b = hf.generate(prompts, params), vl.generate(prompts, params)
    finally:
        hf_w.restore()
        vl_w.restore()
    assert [r[0].text for r in a] == [r[0].text for r in b]
    assert sum(x[0].text != y[0].text for x, y in zip(b, base)) > 0  # the noise mattered
    diff = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x[0].logprobs, y[0].logprobs))
    assert diff < 1e-3
    again = vl.generate(prompts, params)
    assert [(r[0].text, r[0].logprobs) for r in again] == [(r[0].text, r[0].logprobs) for r in base]


@pytest.mark.vllm
def test_members_are_computed_into_tensors_the_worker_keeps(es_engines):
    # A member is written into views the worker hands out (``es_views``): the same memory
    # from one write to the next, never the driver's master, which no write changes.
    _, _, vl, vl_w = es_engines
    shapes = {n: p.shape for n, p in vl_w.params.items()}

    def where() -> dict[str, int]:
        return {n: v.data_ptr() for n, v in
                vl.llm.collective_rpc("es_views", args=(shapes,))[0].items()}

    eps = keyed_noise(run_seed=0, iteration=1)
    before = vl_w.checksum()
    vl_w.perturb(lambda n, s: eps(2, n, s), +1, 0.05)
    first = where()
    vl_w.perturb(lambda n, s: eps(2, n, s), -1, 0.05)
    vl_w.restore()
    assert where() == first
    assert not set(first.values()) & {t.data_ptr() for t in vl_w.master.values()}
    assert vl_w.checksum() == before
