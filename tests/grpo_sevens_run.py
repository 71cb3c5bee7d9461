"""A GRPO run on the ci testbed with a dense synthetic reward ("write the digit 7"), in a
process of its own (a test of the vLLM backend must not start a second in-process engine in
the pytest process). Prints one JSON line: greedy reward before and after, steps' rewards,
and how far the weights moved.

    python tests/grpo_sevens_run.py TESTBED_DIR OUT_DIR BACKEND [key=value ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from es_llm.backends.base import SamplingParams
from es_llm.config import load_config
from es_llm.tasks import registry
from gradient.config import GRPORunConfig
from gradient.loop.setup import build
from gradient.loop.trainer import run
from test_es_direction import Sevens  # the same synthetic task as the ES direction test


def greedy_reward(edges, problems) -> float:
    ids = [list(edges.tokenizer(p.prompt).input_ids) for p in problems]
    out = edges.backend.generate(ids, SamplingParams(n=1, temperature=0, max_tokens=32))
    scores = edges.task.score_many([(p, r[0].text) for p, r in zip(problems, out)])
    return sum(s.reward for s in scores) / len(scores)


def main() -> None:
    testbed, out, backend, *overrides = sys.argv[1:]
    registry.TASKS.register("sevens")(Sevens)  # this process only
    base = {"model": testbed, "backend": backend, "steps": 12, "checkpoint_every": 100,
            "task": {"name": "sevens", "data": str(Path(testbed) / "data" / "countdown_rl.jsonl")},
            "rollout": {"prompts_per_step": 16, "group_size": 8, "max_tokens": 32},
            "optim": {"lr": 3e-4}}
    cfg = load_config(GRPORunConfig, base=base, overrides=overrides)
    edges, problems, state = build(cfg)
    before_params = {n: p.detach().clone() for n, p in edges.model.named_parameters()}
    held = problems[:64]
    before = greedy_reward(edges, held)
    run(cfg, edges, problems, Path(out), state, progress=False)
    after = greedy_reward(edges, held)
    moved = sum(not torch.equal(before_params[n], p) for n, p in edges.model.named_parameters())
    rows = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    print(json.dumps({"before": before, "after": after, "params_changed": moved,
                      "params": len(before_params),
                      "adapter_params": sum(".lora_" in n for n in before_params),
                      "rewards": [r["reward/mean"] for r in rows],
                      "is_diff": [r.get("is/logp_abs_diff_mean") for r in rows]}))
    edges.task.close()


if __name__ == "__main__":
    main()
