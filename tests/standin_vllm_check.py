"""HF against vLLM on one stand-in model, run in its own process by ``test_standins.py``.

In-process vLLM engines share vLLM's global state (one per process), so each architecture's
engine lives in a process of its own. Usage: ``python standin_vllm_check.py MODEL_DIR``; the
last line of stdout is ``RESULT <json>``. One ES-mode engine (worker extension, no prefix
cache) serves every check:

1. greedy: HF and vLLM greedy ids on 20 prompts, and at each first difference the HF
   model's gap between its two best tokens there (a random-init model has near ties, which
   float32 kernels may break either way); the texts of completions that end inside a
   multi-byte character, as each backend wrote them;
2. members: per tensor family, the same keyed noise written into the HF model and into the
   engine (``VLLMWeights``) gives the same greedy ids and logprobs (same tie rule), and
   changes the engine's outputs (``changed``: prompts whose greedy ids changed; ``shift``:
   the largest logprob move on the paths' common prefixes);
   restoring gives back the base outputs bitwise;
3. push: the trainer's copy with noisy weights pushed into the engine (``push_weights``,
   as GRPO does), then the engine's sampled logprobs (T = 1) against the trainer's.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

# Tensor families of the five stand-ins (a family a model lacks selects nothing).
FAMILIES = {"embed": r"embed_tokens", "qkv": r"(q|k|v)_proj", "qk_norm": r"(q|k)_norm",
            "mlp_in": r"(gate|up)_proj", "out": r"o_proj|down_proj",
            "norms": r"layernorm|model\.norm", "lm_head": r"lm_head", "all": r"."}


def greedy_gaps(model, prompt_ids: list[list[int]], a: list, b: list) -> list[float | None]:
    """Per prompt: None when the two greedy id sequences agree, else ``model``'s log-prob gap
    between its best and second-best token at their first difference (after the common
    prefix)."""
    gaps = []
    for ids, x, y in zip(prompt_ids, a, b):
        x, y = list(x[0].token_ids), list(y[0].token_ids)
        if x == y:
            gaps.append(None)
            continue
        j = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + x[:j]])).logits[0, -1].float()
        top = torch.log_softmax(logits, -1).topk(2).values
        gaps.append(float(top[0] - top[1]))
    return gaps


def max_logprob_diff(a: list, b: list) -> float:
    """Largest |Δ logprob| over the common prefix of each prompt's two greedy paths."""
    diff = 0.0
    for x, y in zip(a, b):
        for t, u, p, q in zip(x[0].token_ids, y[0].token_ids, x[0].logprobs, y[0].logprobs):
            if t != u:
                break
            diff = max(diff, abs(p - q))
    return diff


def member_checks(hf, hf_w, vl, vl_w, model, prompts, prompt_ids) -> dict:
    from es_llm.backends.base import SamplingParams
    from populations.noise import keyed_noise

    params = SamplingParams(n=1, temperature=0, max_tokens=24, logprobs=True)
    base = vl.generate(prompts, params)
    eps = keyed_noise(run_seed=0, iteration=0)
    out = {}
    for family, pattern in FAMILIES.items():
        names = [n for n in hf_w.params if re.search(pattern, n)]
        if not names:
            continue

        def noise(name, shape, pattern=pattern):  # direction 3, on the family's tensors
            return eps(3, name, shape) if re.search(pattern, name) else torch.zeros(shape)

        hf_w.perturb(noise, +1, 0.1)
        vl_w.perturb(noise, +1, 0.1)
        try:
            a, b = hf.generate(prompts, params), vl.generate(prompts, params)
            gaps = greedy_gaps(model, prompt_ids, a, b)
        finally:
            hf_w.restore()
            vl_w.restore()
        out[family] = {"tensors": len(names), "gaps": gaps, "logprob_diff": max_logprob_diff(a, b),
                       "texts_equal": sum(x[0].text == y[0].text for x, y in zip(a, b)),
                       "changed": sum(x[0].token_ids != y[0].token_ids for x, y in zip(b, base)),
                       "shift": max_logprob_diff(b, base)}
    again = vl.generate(prompts, params)
    out["restored_bitwise"] = [(r[0].token_ids, r[0].logprobs) for r in again] == \
        [(r[0].token_ids, r[0].logprobs) for r in base]
    return out


def push_gap(vl, model, prompts) -> dict:
    """The trainer's log-probs of the engine's samples after a push, as GRPO compares them."""
    from es_llm.backends.base import SamplingParams
    from gradient.dllm.estimators import EstimateInput, estimate

    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.std())
    vl.push_weights(dict(model.named_parameters()))
    out = vl.generate(prompts, SamplingParams(n=4, temperature=1.0, max_tokens=24, seed=5,
                                              logprobs=True))
    rows = [(vl.prompt_token_ids(prompts[i]), c) for i, row in enumerate(out) for c in row]
    with torch.no_grad():
        e = estimate("autoregressive", EstimateInput(
            model, [SimpleNamespace(prompt_ids=p, completion_ids=list(c.token_ids))
                    for p, c in rows], 1.0, pad_id=vl.tokenizer.pad_token_id, mask_id=0,
            settings=None, with_entropy=False))
    engine_B_T = torch.zeros_like(e.logp_B_T)
    for i, (_, c) in enumerate(rows):
        engine_B_T[i, :len(c.logprobs)] = torch.tensor(c.logprobs)
    diff = (e.logp_B_T - engine_B_T).abs() * e.mask_B_T
    return {"tokens": int(e.mask_B_T.sum()), "mean": float(diff.sum() / e.mask_B_T.sum()),
            "max": float(diff.max())}


def main(folder: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from es_llm.backends.base import SamplingParams
    from es_llm.backends.hf import HFBackend
    from es_llm.backends.vllm_backend import VLLMBackend
    from es_llm.backends.vllm_weights import VLLMWeights
    from es_llm.es.weights import ModuleWeights, select_parameters
    from es_llm.io import read_jsonl
    from es_llm.runtime import Runtime
    from es_llm.tasks import TaskConfig, build_task
    from es_llm.tasks.chat import ChatConfig, render_prompts

    prompts = [r["prompt"] for r in read_jsonl(folder / "data" / "countdown_eval.jsonl")][:20]
    vl = VLLMBackend(str(folder), runtime=Runtime(max_model_len=512), for_es=True)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf = HFBackend(str(folder), model=model, tokenizer=tok)
    prompt_ids = [tok(p).input_ids for p in prompts]
    greedy = SamplingParams(n=1, temperature=0, max_tokens=32, logprobs=True)
    a, b = hf.generate(prompts, greedy), vl.generate(prompts, greedy)
    # Completions whose ids end inside a multi-byte character (a plain decode ends in U+FFFD).
    cut = [(x[0], y[0]) for x, y in zip(a, b) if x[0].token_ids == y[0].token_ids and
           tok.decode(list(x[0].token_ids), skip_special_tokens=True).endswith("\ufffd")]
    # The prompts rendered through the folder's chat template (with a system message and
    # Qwen3's thinking switch), as every command renders them: the same ids in both engines.
    chat = ChatConfig(template=True, system="Answer briefly.", kwargs={"enable_thinking": False})
    task = build_task(TaskConfig(name="countdown", limit=8, chat=chat,
                                 data=str(folder / "data" / "countdown_eval.jsonl")))
    rendered = [p.prompt for p in render_prompts(task.problems(), tok, chat, str(folder))]
    task.close()
    result = {"prompt_ids_equal": prompt_ids == [vl.prompt_token_ids(p) for p in prompts],
              "chat_ids_equal": [tok(p).input_ids for p in rendered]
              == [vl.prompt_token_ids(p) for p in rendered],
              "chat_rendered": all("<|im_start|>system\nAnswer briefly." in p for p in rendered),
              "greedy": {"gaps": greedy_gaps(model, prompt_ids, a, b),
                         "texts_equal": sum(x[0].text == y[0].text for x, y in zip(a, b)),
                         "logprob_diff": max_logprob_diff(a, b),
                         "cut_texts": [(x.text, y.text) for x, y in cut]}}
    hf_w = ModuleWeights(model, select_parameters(model, "all"))
    shadow = AutoModelForCausalLM.from_pretrained(folder)
    vl_w = VLLMWeights(vl.llm, ModuleWeights(shadow, select_parameters(shadow, "all")))
    result["members"] = member_checks(hf, hf_w, vl, vl_w, model, prompts, prompt_ids)
    result["push"] = push_gap(vl, model, prompts[:8])
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))), flush=True)
