"""How closely a vLLM engine serving a LoRA policy agrees with the trainer, run in its own
processes by ``test_lora_trainers.py`` (in-process engines share vLLM's global state, and the
two ways below need engines built differently).

Usage: ``python vllm_lora_check.py TESTBED_DIR``; the last line of stdout is
``RESULT <json>``. The policy is the ci model with a rank-8 adapter on q, k, v, o whose
``B`` is seeded noise (a trained, non-zero adapter), in float32. Each way samples 8 prompts
x 4 at temperature 0.7 with processed logprobs, and the sampled tokens' engine log-probs are
compared with the trainer's (its autoregressive estimator on the PEFT model, same
temperature): max and mean absolute difference over the sampled tokens.

* ``merged``: ``W + (alpha / r) B A`` of every adapted layer, computed in float32, pushed
  into a plain engine through ``push_weights``.
* ``served``: the trainers' path: vLLM's own LoRA serving, an engine built with
  ``lora_engine_args`` holding the base, given the adapter by ``serve_adapter`` (saved in
  PEFT's format, a ``LoRARequest`` per version). As a control, the base model's log-probs
  of the same tokens, which must be far off if the adapter acts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

TEMPERATURE = 0.7


def trained_policy(testbed: Path):
    """The ci model with a seeded, non-zero rank-8 adapter (PEFT), float32, and its
    settings."""
    from transformers import AutoModelForCausalLM

    from es_llm.adapters import LoraSettings, wrap_model

    lora = LoraSettings(rank=8, alpha=16.0)
    model = wrap_model(AutoModelForCausalLM.from_pretrained(testbed, dtype=torch.float32),
                       lora, seed=1).eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model, lora


def gap(model, rows, pad_id: int) -> dict:
    """Max and mean |trainer - engine| log-prob over the sampled tokens of ``rows``
    ((prompt ids, Completion) pairs)."""
    from gradient.dllm.estimators import EstimateInput, estimate

    with torch.no_grad():
        e = estimate("autoregressive", EstimateInput(
            model, [SimpleNamespace(prompt_ids=p, completion_ids=list(c.token_ids))
                    for p, c in rows], TEMPERATURE, pad_id=pad_id, mask_id=0, settings=None,
            with_entropy=False))
    engine_B_T = torch.zeros_like(e.logp_B_T)
    for i, (_, c) in enumerate(rows):
        engine_B_T[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    diff_B_T = (e.logp_B_T - engine_B_T).abs() * e.mask_B_T
    return {"tokens": int(e.mask_B_T.sum()), "max": float(diff_B_T.max()),
            "mean": float(diff_B_T.sum() / e.mask_B_T.sum())}


def sample(vl, prompts: list[str]) -> list:
    """(prompt ids, Completion) rows of 4 samples per prompt at ``TEMPERATURE``."""
    from es_llm.backends.base import SamplingParams

    params = SamplingParams(n=4, temperature=TEMPERATURE, max_tokens=32, seed=5, logprobs=True)
    out = vl.generate(prompts, params)
    ids = [vl.prompt_token_ids(p) for p in prompts]
    return [(ids[i], c) for i, row in enumerate(out) for c in row]


def merged(testbed: Path, prompts: list[str]) -> dict:
    from es_llm.adapters import merged_parameters
    from es_llm.backends.vllm_backend import VLLMBackend

    model, lora = trained_policy(testbed)
    vl = VLLMBackend(str(testbed), logprobs_mode="processed", worker_extension=True)
    vl.push_weights(merged_parameters(model, lora))
    return {"merged": gap(model, sample(vl, prompts), vl.tokenizer.pad_token_id)}


def served(testbed: Path, prompts: list[str]) -> dict:
    from transformers import AutoModelForCausalLM

    from es_llm.adapters import peft_factors
    from es_llm.backends.vllm_backend import VLLMBackend, lora_engine_args

    model, lora = trained_policy(testbed)
    vl = VLLMBackend(str(testbed), logprobs_mode="processed",
                     engine_args=lora_engine_args(lora.rank))
    vl.serve_adapter(peft_factors(model), lora, str(testbed))
    rows = sample(vl, prompts)
    base = AutoModelForCausalLM.from_pretrained(testbed, dtype=torch.float32).eval()
    pad = vl.tokenizer.pad_token_id
    vl.close()
    return {"served": gap(model, rows, pad), "base": gap(base, rows, pad)}


def main(testbed: Path, way: str | None) -> dict:
    from es_llm.io import read_jsonl

    prompts = [r["prompt"] for r in read_jsonl(testbed / "data" / "countdown_eval.jsonl")[:8]]
    if way is not None:
        return {"merged": merged, "served": served}[way](testbed, prompts)
    result = {}
    for child in ("merged", "served"):
        proc = subprocess.run([sys.executable, __file__, str(testbed), child],
                              capture_output=True, text=True, env=os.environ, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"{child} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result.update(json.loads(lines[-1][len("RESULT "):]))
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]), (sys.argv[2:] or [None])[0])),
          flush=True)
