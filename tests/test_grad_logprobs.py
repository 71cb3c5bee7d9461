"""The trainer's completion log-probs (its registered autoregressive estimator): equal to a
one-row-at-a-time reference, differentiable, and equal to what the samplers report in their
"processed" logprobs mode."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from es_llm.backends.base import SamplingParams
from es_llm.backends.hf import HFBackend, sampled_logprobs
from es_llm.io import read_jsonl
from gradient.dllm.estimators import EstimateInput, estimate
from own_process import run_check


@pytest.fixture(scope="module")
def model(ci_testbed):
    return AutoModelForCausalLM.from_pretrained(ci_testbed).eval()


@pytest.fixture(scope="module")
def rows(ci_testbed):
    """Real prompts of different lengths and seeded random completions of 0 to 11 tokens."""
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    prompts = [r["prompt"] for r in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")]
    prompt_ids = [tok(prompts[i] * (1 + i % 3)).input_ids for i in range(6)]
    g = torch.Generator().manual_seed(0)
    lengths = [5, 1, 11, 0, 7, 3]
    completion_ids = [torch.randint(3, len(tok), (n,), generator=g).tolist() for n in lengths]
    assert len({len(p) for p in prompt_ids}) > 3
    return prompt_ids, completion_ids


def trainer_logprobs(model, prompt_ids, completion_ids, temperature, with_entropy=True):
    """``(logp_B_T, entropy_B_T, mask_B_T)`` of the completions as the trainer computes them."""
    rows = [SimpleNamespace(prompt_ids=p, completion_ids=c)
            for p, c in zip(prompt_ids, completion_ids)]
    e = estimate("autoregressive", EstimateInput(model, rows, temperature, pad_id=0, mask_id=0,
                                                 settings=None, with_entropy=with_entropy))
    return e.logp_B_T, e.entropy_B_T, e.mask_B_T


def reference(model, prompt_ids, completion_ids, temperature):
    """One unpadded row at a time through the full model: (logp, entropy) lists per row."""
    out = []
    for p, c in zip(prompt_ids, completion_ids):
        logits_L_V = model(torch.tensor([p + c])).logits[0].float() / temperature
        logp_T_V = torch.log_softmax(logits_L_V[len(p) - 1:len(p) - 1 + len(c)], -1)
        logp_T = logp_T_V.gather(-1, torch.tensor(c, dtype=torch.long)[:, None])[:, 0]
        out.append((logp_T, -(logp_T_V.exp() * logp_T_V).sum(-1)))
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_batched_logprobs_equal_the_per_row_reference(model, rows, temperature):
    prompt_ids, completion_ids = rows
    with torch.no_grad():
        logp_B_T, entropy_B_T, mask_B_T = trainer_logprobs(model, prompt_ids, completion_ids,
                                                           temperature)
        ref = reference(model, prompt_ids, completion_ids, temperature)
    assert logp_B_T.shape == entropy_B_T.shape == mask_B_T.shape == (6, 11)
    assert mask_B_T.sum(-1).tolist() == [len(c) for c in completion_ids]
    for i, (logp_T, entropy_T) in enumerate(ref):
        n = len(completion_ids[i])
        torch.testing.assert_close(logp_B_T[i, :n], logp_T, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy_B_T[i, :n], entropy_T, atol=1e-5, rtol=0)
        # Padding holds zeros, so sums over tokens need no mask.
        assert not logp_B_T[i, n:].any() and not entropy_B_T[i, n:].any()


def test_gradient_equals_the_reference_gradient(ci_testbed, rows):
    """d/dθ of sum(logp) + 0.1 sum(entropy) at T = 0.7, batched vs one row at a time."""
    prompt_ids, completion_ids = rows
    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    logp_B_T, entropy_B_T, _ = trainer_logprobs(model, prompt_ids, completion_ids, 0.7)
    (logp_B_T.sum() + 0.1 * entropy_B_T.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = reference(model, prompt_ids, completion_ids, 0.7)
    sum(lp.sum() + 0.1 * ent.sum() for lp, ent in ref).backward()
    for name, p in model.named_parameters():
        assert grads[name].abs().sum() > 0, f"no gradient reached {name}"
        torch.testing.assert_close(grads[name], p.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_logprobs_equal_the_cpu_ones_and_the_samplers(ci_testbed, model, rows):
    prompt_ids, completion_ids = rows
    with torch.no_grad():
        cpu_B_T, cpu_entropy_B_T, _ = trainer_logprobs(model, prompt_ids, completion_ids, 0.7)
    cuda_model = AutoModelForCausalLM.from_pretrained(ci_testbed).cuda()
    logp_B_T, entropy_B_T, mask_B_T = trainer_logprobs(cuda_model, prompt_ids, completion_ids,
                                                       0.7)
    assert logp_B_T.device.type == entropy_B_T.device.type == mask_B_T.device.type == "cuda"
    torch.testing.assert_close(logp_B_T.cpu(), cpu_B_T, atol=1e-4, rtol=0)
    torch.testing.assert_close(entropy_B_T.cpu(), cpu_entropy_B_T, atol=1e-4, rtol=0)
    logp_B_T.sum().backward()
    assert all(p.grad.abs().sum() > 0 for p in cuda_model.parameters())

    tok = AutoTokenizer.from_pretrained(ci_testbed)
    hf = HFBackend(str(ci_testbed), device="cuda", model=cuda_model, tokenizer=tok,
                   logprobs_mode="processed")
    prompts = [r["prompt"] for r in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")][:4]
    out = [c for row in hf.generate(prompts, SamplingParams(n=2, temperature=0.7, top_p=1.0,
                                                            max_tokens=16, logprobs=True))
           for c in row]
    with torch.no_grad():
        trainer_B_T, _, _ = trainer_logprobs(
            cuda_model, [tok(p).input_ids for p in prompts for _ in range(2)],
            [list(c.token_ids) for c in out], 0.7, with_entropy=False)
    for i, c in enumerate(out):
        torch.testing.assert_close(trainer_B_T[i, :len(c.logprobs)].cpu(),
                                   torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_processed_logprob_of_a_nucleus_is_renormalised():
    # probs [0.5, 0.3, 0.15, 0.05] at T = 1, top_p = 0.7 keeps {0, 1} (mass 0.8):
    # token 0 -> log(0.5 / 0.8), token 1 -> log(0.3 / 0.8); raw mode ignores the nucleus.
    logits_B_V = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2, 1)
    next_B = torch.tensor([0, 1])
    p = SamplingParams(temperature=1.0, top_p=0.7)
    got = sampled_logprobs(logits_B_V, next_B, p, "processed")
    torch.testing.assert_close(got, torch.tensor([math.log(0.5 / 0.8), math.log(0.3 / 0.8)]))
    torch.testing.assert_close(sampled_logprobs(logits_B_V, next_B, p, "raw"),
                               torch.tensor([math.log(0.5), math.log(0.3)]))
    # At T = 0.5 the probs become proportional to p^2: 0.25 / (0.25 + 0.09 + ...).
    hot = sampled_logprobs(logits_B_V, next_B, SamplingParams(temperature=0.5), "processed")
    z = 0.5 ** 2 + 0.3 ** 2 + 0.15 ** 2 + 0.05 ** 2
    torch.testing.assert_close(hot, torch.tensor([math.log(0.25 / z), math.log(0.09 / z)]))


@pytest.mark.parametrize("mode, trainer_temperature", [("processed", 0.7), ("raw", 1.0)])
def test_hf_backend_logprobs_equal_the_trainers(ci_testbed, model, mode, trainer_temperature):
    """Sampling at T = 0.7: processed logprobs are the trainer's at 0.7, raw ones at 1.0."""
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    hf = HFBackend(str(ci_testbed), model=model, tokenizer=tok, logprobs_mode=mode)
    prompts = [r["prompt"] for r in read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")][:6]
    out = hf.generate(prompts, SamplingParams(n=3, temperature=0.7, max_tokens=24, seed=1,
                                              logprobs=True))
    prompt_ids = [tok(p).input_ids for p in prompts for _ in range(3)]
    completions = [c for row in out for c in row]
    with torch.no_grad():
        logp_B_T, _, _ = trainer_logprobs(model, prompt_ids,
                                          [list(c.token_ids) for c in completions],
                                          trainer_temperature, with_entropy=False)
    for i, c in enumerate(completions):
        torch.testing.assert_close(logp_B_T[i, :len(c.logprobs)], torch.tensor(c.logprobs),
                                   atol=1e-4, rtol=0)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_processed_logprobs_and_pushed_weights_match_the_trainer(ci_testbed):
    """In a separate process (see ``vllm_rollout_check.py``): vLLM's processed logprobs at
    T = 0.7 equal the trainer's (measured on CPU fp32: mean |Δ| about 1e-6, max about 1e-5,
    against a mean of about 0.2 at the wrong temperature), and after ``push_weights`` of
    perturbed weights the engine's greedy completions are the HF model's (without the
    prefix-cache reset only 3 of 16 were)."""
    pytest.importorskip("vllm")
    result = run_check("vllm_rollout_check.py", str(ci_testbed), timeout=300)
    mismatch, push = result["mismatch"], result["push"]
    assert mismatch["tokens"] > 500
    assert mismatch["same_temperature"]["mean"] < 1e-4
    assert mismatch["same_temperature"]["max"] < 1e-3
    assert mismatch["temperature_1"]["mean"] > 1e-2  # the engine's logprobs include T
    assert push["equal_to_hf"] == push["prompts"]
    assert push["changed_by_push"] > 0
