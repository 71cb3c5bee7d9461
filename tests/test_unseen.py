"""The larger held-out Countdown set: the replayed pretraining stream is the one the loop
really consumes, and the drawn problems are outside it and outside every held-out file."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import es_llm.testbed.train as train_module
from es_llm.io import read_jsonl
from es_llm.tasks import TaskConfig, arithmetic, build_task
from es_llm.testbed.config import load_testbed_config
from es_llm.testbed.tokenizer import build_tokenizer
from es_llm.testbed.train import _countdown_example, _problem_key, held_out_sets, make_model
from es_llm.testbed.unseen import _key_of, pretraining_keys, unseen_countdown

ROOT = Path(__file__).resolve().parents[1]


def small():
    return load_testbed_config("ci", overrides=["train.steps=5", "train.batch_size=16",
                                                "data.rl_pool_per_tier=20"])


def test_prompt_keys_equal_problem_keys_for_both_kinds():
    cfg, rng = load_testbed_config("ci"), random.Random(3)
    for tier in (2, 3, 4):
        problem, _ = _countdown_example(rng, tier, cfg.data)
        assert _key_of(problem.prompt) == _problem_key(problem)
        problem, _ = arithmetic.generate(rng, tier)
        assert _key_of(problem.prompt) == _problem_key(problem)


def test_replay_is_what_the_pretraining_loop_draws(monkeypatch):
    # Record every example the real loop takes from the default mix, then replay without it.
    cfg, seen = small(), []
    real = train_module.training_example

    def recording(rng, cfg_, excluded):
        prompt, completion = real(rng, cfg_, excluded)
        seen.append(_key_of(prompt))
        return prompt, completion

    monkeypatch.setattr(train_module, "training_example", recording)
    tokenizer = build_tokenizer()
    _, excluded = held_out_sets(cfg)
    train_module.train(make_model(cfg, tokenizer), tokenizer, cfg, excluded, progress=False)
    monkeypatch.undo()
    assert len(seen) == cfg.train.steps * cfg.train.batch_size
    assert pretraining_keys(cfg) == set(seen)


def test_unseen_problems_avoid_pretraining_and_every_held_out_file():
    cfg = small()
    problems, found = unseen_countdown(cfg, per_tier=15)
    keys = [_problem_key(p) for p in problems]
    assert len(set(keys)) == len(keys) == sum(found.values())
    sets, _ = held_out_sets(cfg)
    held = {_problem_key(p) for v in sets.values() for p in v}
    assert "countdown_rl_pool" in sets and not set(keys) & held
    assert not set(keys) & pretraining_keys(cfg)
    # The ci tier 2 is a small problem space that the held-out files already exhaust: it
    # yields what is left (nothing) rather than failing; the larger tiers give all 15.
    assert found == {2: 0, 3: 15, 4: 15}
    assert [p.id for p in unseen_countdown(cfg, per_tier=15)[0]] == [p.id for p in problems]
    assert {p.prompt for p in unseen_countdown(cfg, 15, seed=1)[0]} != {p.prompt for p in problems}


def _script(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "unseen_countdown.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_script_writes_a_task_file_and_refuses_bad_input(tmp_path, ci_testbed):
    out = tmp_path / "unseen.jsonl"
    done = _script("--size", "ci", "--per-tier", "5", "--testbed", str(ci_testbed),
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(out)
    assert len(rows) == 10 and all(r["reference"] for r in rows)
    task = build_task(TaskConfig(name="countdown", data=str(out)))
    problems = task.problems()
    assert all(s.reward == 1.0 for s in task.score_many(
        [(p, p.meta["reference"]) for p in problems]))
    task.close()

    # A second set that excludes the first shares none of its problems.
    dev = tmp_path / "dev.jsonl"
    done = _script("--size", "ci", "--per-tier", "5", "--seed", "1", "--exclude", str(out),
                   "--out", str(dev))
    assert done.returncode == 0, done.stderr
    first = {(tuple(sorted(r["numbers"])), r["target"]) for r in rows}
    second = {(tuple(sorted(r["numbers"])), r["target"]) for r in read_jsonl(dev)}
    assert second and not first & second

    bad = _script("--size", "ci", "--per-tier", "0", "--out", str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and "--per-tier" in bad.stderr
    other = _script("--size", "ci", "--testbed", str(ci_testbed), "--out",
                    str(tmp_path / "y.jsonl"), "train.steps=7")
    assert other.returncode == 2 and "fingerprint" in other.stderr
    not_built = _script("--size", "ci", "--testbed", str(tmp_path), "--out",
                        str(tmp_path / "z.jsonl"))
    assert not_built.returncode == 2 and "not a testbed build" in not_built.stderr
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    (tmp_path / "math.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    for junk, message in ((tmp_path / "junk.jsonl", "is not JSONL"),
                          (tmp_path / "math.jsonl", "no Countdown 'numbers'"),
                          (tmp_path / "none.jsonl", "is not a file"),
                          (ROOT / "configs" / "es_countdown.yaml", "is not JSONL")):
        refused = _script("--size", "ci", "--exclude", str(junk),
                          "--out", str(tmp_path / "w.jsonl"))
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert not any((tmp_path / f).exists() for f in ("x.jsonl", "y.jsonl", "w.jsonl"))
    assert json.loads(out.read_text().splitlines()[0])["id"].startswith("countdown-unseen0-")
