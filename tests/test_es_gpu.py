"""The ES engine on a CUDA device: keyed noise drawn on the GPU, exact perturb/restore in
bf16, and an end-to-end run whose reward rises and whose ledger replays to the same weights.
Not run in CI (no GPU there)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from es_llm.comm.serial import SerialComm
from es_llm.es.config import ESRunConfig
from es_llm.es.engine import read_ledger, replay, run
from es_llm.es.setup import build_edges
from es_llm.es.weights import ModuleWeights, select_parameters
from es_llm.models import resolve_training_data
from es_llm.tasks import TaskConfig
from populations import es as pes
from populations.noise import gaussian
from test_es_direction import greedy_reward, sevens_task  # noqa: F401  (fixture)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_noise_is_a_pure_function_of_the_key():
    a = gaussian(123, (1000, 100), device="cuda")
    assert a.device.type == "cuda"
    assert torch.equal(a, gaussian(123, (1000, 100), device="cuda"))
    assert not torch.equal(a, gaussian(124, (1000, 100), device="cuda"))
    assert abs(float(a.mean())) < 0.01 and abs(float(a.std()) - 1) < 0.01


def test_perturb_then_restore_is_bitwise_exact_on_cuda_bf16(ci_testbed):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.bfloat16).cuda()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    w = ModuleWeights(model, select_parameters(model, "all"))
    w.perturb(lambda name, shape: gaussian(7, shape, device="cuda"), +1, 1e-2)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    w.restore()
    for n, p in model.named_parameters():
        assert torch.equal(before[n], p), n


def test_es_on_cuda_raises_the_reward_and_replays_bitwise(ci_testbed, tmp_path, sevens_task):  # noqa: F811
    cfg = ESRunConfig(model=str(ci_testbed),
                      task=TaskConfig(name="sevens",
                                      data=str(ci_testbed / "data" / "countdown_rl.jsonl")),
                      es=pes.ESConfig(population=16, sigma=0.02, lr=0.02, antithetic=True,
                                      noise_device="cuda"),
                      iterations=10, prompts_per_iteration=32, max_tokens=32, backend="hf",
                      device="cuda", checkpoint_every=100)
    edges, problems = build_edges(resolve_training_data(cfg), SerialComm())
    held = problems[:64]
    before = greedy_reward(edges, held)
    state = run(cfg, edges, problems, tmp_path / "run", progress=False)
    after = greedy_reward(edges, held)
    print(f"greedy reward on cuda before {before:.3f} after {after:.3f}")
    assert after > before + 0.05, (before, after)

    # The ledger alone rebuilds the final weights from the base model, on the same device.
    base = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.float32).cuda()
    base_weights = ModuleWeights(base, select_parameters(base, "all"))
    rebuilt = replay(cfg.es, pes.init(cfg.es, base_weights.master, cfg.seed),
                     read_ledger(tmp_path / "run"))
    for name, t in state.params.items():
        assert torch.equal(rebuilt.params[name], t), name
