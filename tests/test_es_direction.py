"""ES moves a real LM toward its reward: a dense synthetic reward on the ci testbed
("write the digit 7"), ten iterations of full-rank and of low-rank ES, greedy reward before
and after."""

from __future__ import annotations

import pytest

from es_llm.backends.base import SamplingParams
from es_llm.comm.serial import SerialComm
from es_llm.es.config import EngineSettings, ESRunConfig
from es_llm.es.engine import run
from es_llm.es.setup import build_edges
from es_llm.models import resolve_training_data
from es_llm.tasks import Score, TaskConfig
from es_llm.tasks.base import InProcessTask
from es_llm.tasks.countdown import load_problems
from es_llm.tasks import registry
from populations.es import ESConfig


class Sevens(InProcessTask):
    """Reward = share of the completion's characters that are '7' (dense, in [0, 1])."""

    name = "sevens"

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg

    def problems(self):
        return load_problems(self.cfg.data, self.cfg.limit)

    def _score(self, problem, completion):
        share = completion.count("7") / max(1, len(completion))
        return Score(reward=share, correct=share > 0.5, answer=None)


@pytest.fixture
def sevens_task():
    # Registered for this test only, so other tests still see just the real tasks.
    with registry.TASKS.registered("sevens", Sevens):
        yield


def greedy_reward(edges, problems) -> float:
    out = edges.backend.generate([p.prompt for p in problems],
                                 SamplingParams(n=1, temperature=0, max_tokens=32))
    scores = edges.task.score_many([(p, r[0].text) for p, r in zip(problems, out)])
    return sum(s.reward for s in scores) / len(scores)


@pytest.mark.slow
@pytest.mark.parametrize("es, engine", [
    (ESConfig(population=16, sigma=0.02, lr=0.02, antithetic=True), EngineSettings()),
    # Low-rank members served as rows of one batched call, each pair on its own 4 prompts.
    (ESConfig(population=128, sigma=0.02, lr=0.02, antithetic=True, kind="lowrank", rank=1,
              shaping="pair_diff"),
     EngineSettings(serve="rows", prompts_per_member=4, members_per_call=64)),
], ids=["full", "lowrank"])
def test_es_raises_a_dense_reward_on_the_ci_testbed(ci_testbed, tmp_path, sevens_task, es,
                                                    engine):
    cfg = ESRunConfig(model=str(ci_testbed),
                      task=TaskConfig(name="sevens",
                                      data=str(ci_testbed / "data" / "countdown_rl.jsonl")),
                      es=es, engine=engine, iterations=10, prompts_per_iteration=32, max_tokens=32,
                      backend="hf", checkpoint_every=100)
    edges, problems = build_edges(resolve_training_data(cfg), SerialComm())
    held = problems[:64]
    before = greedy_reward(edges, held)
    run(cfg, edges, problems, tmp_path / "run", progress=False)
    after = greedy_reward(edges, held)
    print(f"greedy reward before {before:.3f} after {after:.3f}")
    assert after > before + 0.05, (before, after)
