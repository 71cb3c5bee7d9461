"""Sliding-window parity of vLLM and transformers, in a process of its own (vLLM engines share
process-wide state, so each check starts one engine in a process of its own): run by
tests/test_swa.py, prints one JSON line.

    python tests/swa_parity_check.py convention SCRATCH_DIR
    python tests/swa_parity_check.py parity SWA_MODEL_DIR

1. **Window convention.** A one-layer model whose only layer slides over W keys, built in
   SCRATCH_DIR: changing the token W-1 places before the last one must change the last
   position's log-probs on both backends (it is inside the window), changing the token W
   places before must change nothing (outside). Reported per backend.
2. **Parity.** The model in SWA_MODEL_DIR samples completions with vLLM on held-out prompts;
   transformers scores the same ids; the largest log-prob difference over every sampled
   token of sequences longer than the window is reported.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
WINDOW = 4


def _one_layer(folder: Path) -> None:
    """A tiny one-layer sliding model with sharpened attention, saved with the testbed's
    tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from es_llm.testbed.swa import convert
    from es_llm.testbed.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=128, max_position_embeddings=128,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model = convert(llama, WINDOW, ())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(8.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _last_logp_hf(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)


def _prompt_logp_vllm(llm, ids: list[int], token: int) -> float:
    """vLLM's log-prob of ``token`` after ``ids`` (a prompt log-prob of ids + [token])."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids + [token]}],
                       SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0),
                       use_tqdm=False)
    return out[0].prompt_logprobs[-1][token].logprob


def convention(scratch: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.backends.vllm_backend import VLLMBackend
    from es_llm.runtime import Runtime

    tiny = Path(scratch) / "one_layer"
    _one_layer(tiny)
    hf = AutoModelForCausalLM.from_pretrained(tiny).eval()
    tok = AutoTokenizer.from_pretrained(tiny)
    base = tok("nums 10 4 5 3 make 37\n").input_ids
    last = len(base) - 1

    def edit(at: int) -> list[int]:
        ids = list(base)
        ids[at] = tok.convert_tokens_to_ids("9") if ids[at] != tok.convert_tokens_to_ids("9") \
            else tok.convert_tokens_to_ids("8")
        return ids

    inside, outside = edit(last - (WINDOW - 1)), edit(last - WINDOW)
    probe = tok.convert_tokens_to_ids("1")
    ref = _last_logp_hf(hf, base)
    result = {"window": WINDOW,
              "hf_inside_changes": float((_last_logp_hf(hf, inside) - ref).abs().max()),
              "hf_outside_changes": float((_last_logp_hf(hf, outside) - ref).abs().max())}
    engine = VLLMBackend(str(tiny), runtime=Runtime(max_model_len=128))
    v_ref = _prompt_logp_vllm(engine.llm, base, probe)
    result["vllm_inside_changes"] = abs(_prompt_logp_vllm(engine.llm, inside, probe) - v_ref)
    result["vllm_outside_changes"] = abs(_prompt_logp_vllm(engine.llm, outside, probe) - v_ref)
    result["vllm_vs_hf_probe"] = abs(v_ref - float(ref[probe]))
    return result


def parity(model_dir: str) -> dict:
    """vLLM samples on held-out prompts; transformers scores the same ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.backends.base import SamplingParams
    from es_llm.backends.vllm_backend import VLLMBackend

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    window = model.config.sliding_window
    rows = [json.loads(x) for x in (Path(model_dir) / "data" / "countdown_eval.jsonl").open()]
    prompts = [r["prompt"] for r in rows[::7][:8]]
    engine = VLLMBackend(model_dir, seed=0)
    outs = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=64, seed=3,
                                                   logprobs=True))
    worst, longest, compared = 0.0, 0, 0
    for prompt, row in zip(prompts, outs):
        ids = tok(prompt).input_ids
        for c in row:
            seq = ids + list(c.token_ids)
            longest = max(longest, len(seq))
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
            hf = [float(lp[len(ids) - 1 + i, t]) for i, t in enumerate(c.token_ids)]
            worst = max([worst] + [abs(a - b) for a, b in zip(hf, c.logprobs)])
            compared += len(hf)
    return {"parity_max_abs_diff": worst, "parity_longest": longest,
            "parity_tokens": compared, "model_window": window}


if __name__ == "__main__":
    check = {"convention": convention, "parity": parity}[sys.argv[1]]
    print(json.dumps(check(sys.argv[2])))
