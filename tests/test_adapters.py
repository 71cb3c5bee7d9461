"""LoRA adapters: PEFT's initialisation from an explicit generator, merged weights equal to
PEFT's adapted model, the saved folder loads in PEFT, and bad targets are refused."""

import math

import pytest
import torch

from es_llm.adapters import (LoraSettings, init_factors, merged_tensors, save_adapter,
                             target_linears)
from es_llm.errors import BadInput


def test_targets_by_last_name_and_all_linear_skips_the_head(tiny_qwen2):
    model = tiny_qwen2
    chosen = target_linears(model, LoraSettings(target_modules=("q_proj", "v_proj")))
    assert list(chosen) == [f"model.layers.{i}.self_attn.{p}" for i in range(2)
                            for p in ("q_proj", "v_proj")]
    every = target_linears(model, LoraSettings(target_modules=("all-linear",)))
    assert len(every) == 2 * 7 and "lm_head" not in every


def test_init_is_peft_default_and_seeded(tiny_qwen2):
    model = tiny_qwen2
    lora = LoraSettings(rank=4)
    linears = target_linears(model, lora)
    a, b = init_factors(linears, lora, 7), init_factors(linears, lora, 7)
    assert all(torch.equal(a[k], b[k]) for k in a)
    A = a["model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert A.shape == (4, 32)
    # kaiming_uniform(a=sqrt(5)) on fan_in 32: bound = sqrt(6 / ((1 + 5) * 32)) = 1/sqrt(32).
    assert float(A.abs().max()) <= 1 / math.sqrt(32) and float(A.abs().max()) > 0.5 / math.sqrt(32)
    assert all(float(t.abs().max()) == 0 for k, t in a.items() if "lora_B" in k)
    assert not torch.equal(A, init_factors(linears, lora, 8)[
        "model.layers.0.self_attn.q_proj.lora_A.weight"])


def test_merged_weights_equal_peft_and_saved_adapter_loads(tmp_path, tiny_qwen2):
    from peft import PeftModel
    from transformers import Qwen2ForCausalLM

    model = tiny_qwen2
    lora = LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "down_proj"))
    factors = init_factors(target_linears(model, lora), lora, 3)
    g = torch.Generator().manual_seed(1)
    factors = {k: (torch.randn(t.shape, generator=g) * 0.1 if "lora_B" in k else t)
               for k, t in factors.items()}
    model.save_pretrained(tmp_path / "base")
    save_adapter(tmp_path / "adapter", factors, lora, str(tmp_path / "base"))
    peft_model = PeftModel.from_pretrained(Qwen2ForCausalLM.from_pretrained(tmp_path / "base"),
                                           tmp_path / "adapter").eval()
    merged = Qwen2ForCausalLM.from_pretrained(tmp_path / "base").eval()
    base = {n: p.detach() for n, p in merged.named_parameters()}
    with torch.no_grad():
        for name, w in merged_tensors(base, factors, lora).items():
            merged.get_parameter(name).copy_(w)
    ids = torch.randint(0, 64, (2, 9), generator=g)
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, merged(ids).logits, atol=1e-5)
        # The delta is really there: the merged model differs from the base.
        assert not torch.allclose(model(ids).logits, merged(ids).logits, atol=1e-3)


@pytest.mark.parametrize("settings, words", [
    (dict(target_modules=("qkv",)), "valid names are: down_proj, gate_proj, k_proj"),
    (dict(rank=0), "lora.rank must be an integer >= 1"),
    (dict(rank=33), "choose lora.rank between 1 and 32"),
    (dict(alpha=-1.0), "lora.alpha must be a positive number"),
    (dict(dropout=1.0), "lora.dropout must lie in [0, 1)"),
])
def test_bad_settings_are_refused(settings, words, tiny_qwen2):
    with pytest.raises(BadInput, match=words.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        target_linears(tiny_qwen2, LoraSettings(**settings))
