"""Trainer/engine agreement, run in its own process by ``test_grad_logprobs.py``.

The test session already holds one in-process vLLM engine, and in-process engines share
vLLM's global state, so an engine with other settings (processed logprobs, prefix caching
on) must live in a separate process. Usage: ``python vllm_rollout_check.py TESTBED_DIR``;
the last line of stdout is ``RESULT <json>``.

1. Sample at temperature 0.7 with processed logprobs and compare them with the trainer's
   log-probs (its autoregressive estimator) of the same tokens at 0.7 (and, as a control, at 1.0).
2. Perturb every weight of the trainer's copy with seeded noise, ``push_weights`` it into
   the engine, and compare greedy completions with the HF model holding the same weights.
   The prompts were generated once before the push, so with prefix caching on a stale
   cached prefix would show up here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def sampled_mismatch(vl, model, prompts: list[str], temperature: float) -> dict:
    from types import SimpleNamespace

    from es_llm.backends.base import SamplingParams
    from gradient.dllm.estimators import EstimateInput, estimate

    params = SamplingParams(n=4, temperature=temperature, max_tokens=32, seed=5, logprobs=True)
    out = vl.generate(prompts, params)
    prompt_ids = [vl.prompt_token_ids(p) for p in prompts]
    rows = [(prompt_ids[i], c) for i, row in enumerate(out) for c in row]
    engine_lps = [c.logprobs for _, c in rows]
    result = {"tokens": sum(len(lp) for lp in engine_lps)}
    for name, t in (("same_temperature", temperature), ("temperature_1", 1.0)):
        with torch.no_grad():
            e = estimate("autoregressive", EstimateInput(
                model, [SimpleNamespace(prompt_ids=p, completion_ids=list(c.token_ids))
                        for p, c in rows], t, pad_id=vl.tokenizer.pad_token_id, mask_id=0,
                settings=None, with_entropy=False))
        logp_B_T, mask_B_T = e.logp_B_T, e.mask_B_T
        engine_B_T = torch.zeros_like(logp_B_T)
        for i, lp in enumerate(engine_lps):
            engine_B_T[i, :len(lp)] = torch.tensor(lp)
        diff = (logp_B_T - engine_B_T).abs() * mask_B_T
        result[name] = {"mean": float(diff.sum() / mask_B_T.sum()), "max": float(diff.max())}
    return result


def pushed_weights_agree(vl, model, tokenizer, prompts: list[str]) -> dict:
    from es_llm.backends.base import SamplingParams
    from es_llm.backends.hf import HFBackend

    greedy = SamplingParams(n=1, temperature=0, max_tokens=32)
    before = vl.generate(prompts, greedy)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.std())
    vl.push_weights(dict(model.named_parameters()))
    after = vl.generate(prompts, greedy)
    hf = HFBackend("", model=model, tokenizer=tokenizer).generate(prompts, greedy)
    ids = lambda out: [r[0].token_ids for r in out]  # noqa: E731
    return {"prompts": len(prompts),
            "equal_to_hf": sum(a == b for a, b in zip(ids(after), ids(hf))),
            "changed_by_push": sum(a != b for a, b in zip(ids(after), ids(before)))}


def main(testbed: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.backends.vllm_backend import VLLMBackend
    from es_llm.io import read_jsonl

    rows = read_jsonl(testbed / "data" / "countdown_eval.jsonl")
    # Long prompts (nine problems in a row, about 150 tokens) fill a whole KV block (128
    # tokens on the CPU), so the prefix cache has something to hold across the weight push.
    prompts = ["".join(r["prompt"] for r in rows[i:i + 9]) for i in range(16)]
    vl = VLLMBackend(str(testbed), logprobs_mode="processed", worker_extension=True)
    model = AutoModelForCausalLM.from_pretrained(testbed).eval()
    tokenizer = AutoTokenizer.from_pretrained(testbed)
    return {"mismatch": sampled_mismatch(vl, model, prompts[:8], 0.7),
            "push": pushed_weights_agree(vl, model, tokenizer, prompts)}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))), flush=True)
