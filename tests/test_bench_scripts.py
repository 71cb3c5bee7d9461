"""The benchmark scripts refuse counts they cannot honour before they build or time anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("option, value", [("--loop-repeats", "0"), ("--repeats", "0"),
                                           ("--repeats", "-3"), ("--loop-repeats", "two")])
def test_bench_es_refuses_a_count_below_one(option, value, tmp_path):
    # A zero once fell back to --repeats without a word; every count now needs >= 1.
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_es.py"), option, value],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "ES_LLM_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert option in proc.stderr and "at least 1" in proc.stderr and value in proc.stderr
    assert not (tmp_path / "cache").exists()  # nothing built


def test_bench_es_times_the_engine_without_generating_again(ci_testbed):
    # Item 1's engine share evaluates every member with generation replayed: the timed
    # evaluations must never reach the backend, and must leave the master served.
    sys.path.insert(0, str(SCRIPTS))
    import bench_es
    from es_llm.comm.serial import SerialComm
    from es_llm.es.config import ESRunConfig
    from es_llm.es.engine import prompt_batch
    from es_llm.es.setup import build_edges
    from es_llm.models import resolve_training_data
    from es_llm.tasks import TaskConfig
    from populations import es as pes

    cfg = resolve_training_data(ESRunConfig(
        model=str(ci_testbed), task=TaskConfig(name="countdown"), backend="hf",
        prompts_per_iteration=4, max_tokens=8,
        es=pes.ESConfig(population=4, sigma=0.01, lr=0.005, antithetic=True)))
    edges, problems = build_edges(cfg, SerialComm())
    calls = []
    generate = edges.backend.generate
    edges.backend.generate = lambda *a, **k: calls.append(a[0]) or generate(*a, **k)
    state = pes.init(cfg.es, edges.weights.master, cfg.seed)
    seconds = bench_es.engine_beyond_generation(edges, state, pes.ask(cfg.es, state),
                                                prompt_batch(problems, cfg, 0), cfg, repeats=2)
    assert seconds > 0
    assert len(calls) == 1  # every member shares the batch: one real call, then replays
    for name, p in edges.weights.params.items():
        assert torch.equal(p, edges.weights.master[name])
    edges.task.close()


def test_bench_es_lowrank_items_count_what_each_side_generated(ci_testbed):
    # Item 6 prints tokens/s beside samples/s: the token counts must be the completions'
    # own (members may stop later than the base model on the same prompts).
    from types import SimpleNamespace

    sys.path.insert(0, str(SCRIPTS))
    import bench_es

    args = SimpleNamespace(rank=2, population=8, prompts_per_member=2, members_per_call=4,
                           max_tokens=8, device="cpu", dtype="float32", noise_device="cpu",
                           repeats=1)
    r = bench_es.lowrank_throughput(str(ci_testbed), args)
    assert r["samples"] == 16 and r["per_call"] == 8
    assert min(r["rows_s"], r["plain_s"], r["full_s"]) > 0
    # The same rows generated again, greedy: each side's count is its completions' length.
    from es_llm.backends.base import SamplingParams
    from es_llm.es.engine import evaluate_members

    cfg, edges, state, members, batch = bench_es.lowrank_setup(str(ci_testbed), args, 8)
    params = SamplingParams(n=1, temperature=0.0, max_tokens=cfg.max_tokens, seed=cfg.seed)
    plain = bench_es.plain_batched(edges.backend, bench_es.member_rows(cfg, members, batch),
                                   params, r["per_call"])
    assert r["plain_tokens"] == sum(len(c.token_ids) for c in plain)
    assert r["rows_tokens"] == sum(
        out[5] for out in evaluate_members(edges, state, members, batch, cfg).values())
    assert r["plain_tokens"] > r["samples"]  # tokens, not completions, were counted
    edges.task.close()
