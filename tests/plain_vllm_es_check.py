"""es-llm's ES iteration against the plain loop of ``scripts/plain_vllm_es.py``, run in its
own process by ``test_plain_vllm_es.py`` (the test session already holds one in-process vLLM
engine, and a second one must live in another process). Usage: ``python
plain_vllm_es_check.py TESTBED_DIR``; the last line of stdout is ``RESULT <json>``.

From the same weights, es-llm's ``step`` (full-rank, mirrored, z-scored, SGD, backend vllm)
and the plain loop over the very engine es-llm built run iteration 0 on the same prompts,
scored by the dense "sevens" reward of ``test_es_direction.py`` (so members' rewards differ).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import plain_vllm_es  # noqa: E402


def main(testbed: Path) -> dict:
    from es_llm.comm.serial import SerialComm
    from es_llm.es.config import ESRunConfig
    from es_llm.es.engine import prompt_batch, step
    from es_llm.es.setup import build_edges
    from es_llm.models import resolve_training_data
    from es_llm.tasks import TaskConfig
    from es_llm.tasks import registry
    from populations import es as pes
    from test_es_direction import Sevens

    with registry.TASKS.registered("sevens", Sevens):
        cfg = resolve_training_data(ESRunConfig(
            model=str(testbed), backend="vllm", prompts_per_iteration=16, max_tokens=32,
            task=TaskConfig(name="sevens", data=str(testbed / "data" / "countdown_rl.jsonl")),
            es=pes.ESConfig(population=6, sigma=0.02, lr=0.02, antithetic=True)))
        edges, problems = build_edges(cfg, SerialComm())
    state = pes.init(cfg.es, edges.weights.master, cfg.seed)
    new_state, _, ledger = step(edges, state, problems, cfg)
    edges.weights.set_master(state.params)
    batch = prompt_batch(problems, cfg, 0)

    def score(texts):
        return [s.reward for s in edges.task.score_many(list(zip(batch, texts)))]

    theta, rewards = plain_vllm_es.iteration(
        edges.backend.llm, state.params, [p.prompt for p in batch], score, seed=cfg.seed,
        step=0, population=cfg.es.population, sigma=cfg.es.sigma, lr=cfg.es.lr,
        max_tokens=cfg.max_tokens)
    edges.task.close()
    return {"rewards_es_llm": ledger["rewards_N_P"], "rewards_plain": rewards.tolist(),
            "tensors": len(theta),
            "equal": sum(torch.equal(theta[n], new_state.params[n]) for n in theta),
            "moved": sum(not torch.equal(state.params[n], new_state.params[n]) for n in theta),
            "max_diff": max(float((theta[n] - new_state.params[n]).abs().max()) for n in theta)}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))), flush=True)
