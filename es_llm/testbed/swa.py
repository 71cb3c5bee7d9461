"""SWARR's first stage: the student converted to sliding-window attention, then SFT.

SWARR (Liu, Dong, Xie et al., arXiv 2606.11634) converts a full-attention model to
sliding-window attention (SWA) by supervised fine-tuning and then adapts it with on-policy
RL, finding that RL recovers much of what the conversion loses because its rollouts are
generated under the window. Only the abstract is public; window sizes, layer choice and the
SFT data are the project's: a window of ``swa.window`` tokens on the layers ``swa.layers``
(every layer by default), SFT on the student's own pretraining mix (``train.train``'s
example stream, its first ``swa.train.steps`` batches) with ``swa.train``'s schedule.

The architecture: transformers' Llama ignores sliding windows, and vLLM 0.32's Qwen2 honours
none per layer (only whole-model windows), so the converted model is a Ministral decoder
(``model_type: ministral``: Llama's weights and layout, no biases, an explicit per-layer
``layer_types`` list), which transformers runs with a window per layer. vLLM has no
Ministral class but runs the same weights as ``MistralForCausalLM`` (its Llama code), which
reads ``layer_types`` per layer; ``VLLMBackend`` maps the architecture when it loads such a
folder. Both keep ``window`` keys per query, the query itself included
(``tests/test_swa.py`` checks the convention on each backend and the logits' parity).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from es_llm.io import write_json_atomic
from es_llm.testbed.config import TestbedConfig
from es_llm.testbed.teachers import save_model
from es_llm.testbed.train import held_out_sets, train

NO_SFT = "no_sft"


def layer_types(num_layers: int, layers: tuple[int, ...]) -> list[str]:
    """transformers' per-layer attention kinds: ``sliding_attention`` on ``layers`` (all
    when empty), ``full_attention`` elsewhere."""
    chosen = set(layers) if layers else set(range(num_layers))
    return ["sliding_attention" if i in chosen else "full_attention" for i in range(num_layers)]


def convert(student, window: int, layers: tuple[int, ...]):
    """A Ministral decoder with the Llama ``student``'s shape and weights whose ``layers``
    attend over ``window`` keys (``()``: every layer). With a window beyond the sequence its
    logits equal the student's exactly (tested)."""
    from transformers import MinistralConfig, MinistralForCausalLM

    c = student.config
    config = MinistralConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads, hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_parameters=dict(c.rope_parameters), tie_word_embeddings=c.tie_word_embeddings,
        sliding_window=window, layer_types=layer_types(c.num_hidden_layers, layers),
        bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        model = MinistralForCausalLM(config)
    missing, unexpected = model.load_state_dict(student.state_dict(), strict=False)
    # The tied output matrix is the embedding's; nothing else may be left out.
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"weights do not map: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def build_swa(tmp: Path, student: Path, cfg: TestbedConfig, progress: bool, report) -> None:
    """``tmp/no_sft`` (the student's weights under the window) and ``tmp`` (the same after the
    conversion SFT), each with the student's held-out data and its pass@k (``report``)."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    w = cfg.swa
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(student)
    model = convert(AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32),
                    w.window, w.layers)
    save_model(model, tokenizer, tmp / NO_SFT)
    _, excluded = held_out_sets(cfg)
    stats = train(model, tokenizer, replace(cfg, train=w.train), excluded, progress)
    save_model(model, tokenizer, tmp)
    for folder in (tmp, tmp / NO_SFT):
        shutil.copytree(student / "data", folder / "data")
    info = {"window": w.window, "layer_types": model.config.layer_types, "train": stats,
            "build_s": round(time.perf_counter() - t0, 1),
            "report": report(tmp), "no_sft": {"report": report(tmp / NO_SFT)}}
    write_json_atomic(tmp / "testbed.json", {"swa": info})
