"""vLLM's prompt-embeddings prefill against its token prompts, run in its own process by
``test_latent_revise.py`` (in-process vLLM engines share global state, one per process).

Usage: ``python vllm_embeds_check.py MODEL_DIR``; the last line of stdout is
``RESULT <json>``: whether the greedy ids after the one-hot soft prefix (the prompt's own
tokens as input embeddings) equal those of the token prompt, per prompt, and whether
embeddings moved off the vertices change the logprobs (the engine reads what it is given).
"""

from __future__ import annotations

import json
import sys

import torch


def main(model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from es_llm.backends.base import SamplingParams
    from es_llm.backends.vllm_backend import VLLMBackend
    from es_llm.runtime import Runtime
    from soft_prompts import one_hot_soft

    engine = VLLMBackend(model_dir, runtime=Runtime(max_model_len=256),
                         engine_args={"enable_prompt_embeds": True})
    tok = engine.tokenizer
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = [("nums 7 3 4 make 25\n", "7*3=21 "), ("nums 2 9 5 make 13\n", "9-5=4 "),
             ("nums 8 6 make 2\n", ""), ("nums 1 4 6 9 make 20\n", "9+6=15 15+4=19 ")]
    prompts = [tok(p).input_ids + tok(x, add_special_tokens=False).input_ids for p, x in texts]
    soft = one_hot_soft(model, prompts)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=16, seed=0, logprobs=True)
    by_ids = engine.generate(prompts, greedy)
    by_embeds = engine.generate(soft, greedy)
    noisy = [s + torch.randn(s.shape, generator=torch.Generator().manual_seed(0)) for s in soft]
    moved = engine.generate(noisy, greedy)
    print("RESULT " + json.dumps({
        "equal": [a[0].token_ids == b[0].token_ids for a, b in zip(by_ids, by_embeds)],
        "noisy_differs": [a[0].logprobs != b[0].logprobs for a, b in zip(by_ids, moved)]}))


if __name__ == "__main__":
    main(sys.argv[1])
