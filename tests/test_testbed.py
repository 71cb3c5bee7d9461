"""The testbed builder: deterministic, cached by config, held-out sets kept out of training,
and a model folder that the Auto classes load."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from es_llm.config import dump_yaml
from es_llm.errors import BadInput
from es_llm.io import read_jsonl
from es_llm.testbed.build import build_testbed
from es_llm.testbed.train import _problem_key, held_out_sets, make_model, record, training_example
from es_llm.testbed.config import load_testbed_config


def tiny(seed=0, *extra):
    # A few training steps are enough to show determinism; the report eval stays small too.
    return load_testbed_config("ci", overrides=[
        f"seed={seed}", "train.steps=6", "data.eval_per_tier=3", "data.rl_per_tier=3",
        "report.samples=2", "report.max_tokens=8", "teachers.strong.train.steps=4",
        "teachers.weak.train.steps=4", "teachers.weak.rl_steps=2", "teachers.weak.rl_prompts=3",
        "teachers.weak.rl_group=2", "teachers.report_samples=1", "diffusion.enabled=true",
        "diffusion.train.steps=4", *extra])


def weights_digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_build_is_deterministic_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ES_LLM_CACHE", str(tmp_path / "cache-a"))
    a, info_a = build_testbed(tiny(), tmp_path / "a", progress=False, echo=lambda *_: None)
    monkeypatch.setenv("ES_LLM_CACHE", str(tmp_path / "cache-b"))
    b, _ = build_testbed(tiny(), tmp_path / "b", progress=False, echo=lambda *_: None)
    assert weights_digest(a) == weights_digest(b)
    assert weights_digest(a / "diffusion") == weights_digest(b / "diffusion")
    assert (a / "data" / "countdown_eval.jsonl").read_text() == \
        (b / "data" / "countdown_eval.jsonl").read_text()
    # A second request for the same config is served from the cache, not rebuilt.
    said = []
    c, _ = build_testbed(tiny(), tmp_path / "new" / "dirs" / "c", progress=False, echo=said.append)
    assert any("found in cache" in s for s in said)
    assert weights_digest(c) == weights_digest(a)
    # One served from the cache under another report setting records the config it asked
    # for, not the first builder's.
    other, served = tiny(0, "report.samples=3"), []
    e, _ = build_testbed(other, tmp_path / "e", progress=False, echo=served.append)
    assert served and all("found in cache" in s for s in served)
    assert weights_digest(e) == weights_digest(a)
    assert (e / "testbed.yaml").read_text() == dump_yaml(other) != (c / "testbed.yaml").read_text()
    # Another seed is another model.
    d, _ = build_testbed(tiny(seed=1), tmp_path / "d", progress=False, echo=lambda *_: None)
    assert weights_digest(d) != weights_digest(a)
    assert info_a["parameters"] == sum(
        p.numel() for p in AutoModelForCausalLM.from_pretrained(a).parameters())


def test_fingerprint_ignores_report_settings_only():
    base = load_testbed_config("ci")
    assert base.fingerprint() == load_testbed_config("ci", overrides=["report.samples=3"]).fingerprint()
    assert base.fingerprint() != load_testbed_config("ci", overrides=["train.lr=0.01"]).fingerprint()


def test_held_out_sets_are_disjoint_and_never_trained_on():
    cfg = load_testbed_config("ci")
    sets, excluded = held_out_sets(cfg)
    keys = {name: {_problem_key(p) for p in problems} for name, problems in sets.items()}
    assert not keys["countdown_eval"] & keys["countdown_rl"]
    assert len(keys["countdown_eval"]) == cfg.data.eval_per_tier * len(cfg.data.countdown_tiers)
    rng = random.Random(0)
    for _ in range(2000):
        prompt, completion = training_example(rng, cfg, excluded)
        assert prompt not in {p.prompt for p in sets["countdown_eval"]}
    # Tiers are all present in the eval set.
    assert {p.difficulty for p in sets["countdown_eval"]} == set(cfg.data.countdown_tiers)


def test_too_small_problem_space_is_a_clear_error():
    cfg = load_testbed_config("ci", overrides=["data.countdown_tiers=[2]",
                                               "data.countdown_weights=[1.0]",
                                               "data.countdown_max_number=3",
                                               "data.eval_per_tier=500"])
    with pytest.raises(BadInput, match="too small"):
        held_out_sets(cfg)


def test_bad_sizes_and_shapes_are_rejected():
    with pytest.raises(BadInput, match="valid sizes are: ci, default"):
        load_testbed_config("huge")
    with pytest.raises(BadInput, match="head size"):
        load_testbed_config("ci", overrides=["model.num_heads=4", "model.num_kv_heads=4"])


def test_ci_testbed_loads_with_auto_classes_and_solves_something(ci_testbed):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    assert model.config.model_type == "llama"
    info = json.loads((ci_testbed / "testbed.json").read_text())
    assert info["size"] == "ci" and info["report"]["pass@1"] > 0
    # The gold-format trace of a held-out problem is more likely under the model than a
    # shuffled version of the same characters: it learned the format, not just characters.
    row = read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")[0]
    good = "1+1=2 <answer>1+1</answer>"
    bad = "".join(sorted(good))
    def nll(text):
        ids = tok(row["prompt"] + text).input_ids + [tok.eos_token_id]
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    assert nll(good) < nll(bad)


def test_out_paths_that_replacing_would_destroy_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ES_LLM_CACHE", str(tmp_path / "cache"))
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(BadInput, match="not a folder"):
        build_testbed(tiny(), precious, progress=False, echo=lambda *_: None)
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(BadInput, match="symbolic link"):
        build_testbed(tiny(), dangling, progress=False, echo=lambda *_: None)
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "draft.txt").write_text("keep me too")
    with pytest.raises(BadInput, match="not a testbed build"):
        build_testbed(tiny(), folder, progress=False, echo=lambda *_: None)
    assert precious.read_text() == "keep me" and (folder / "draft.txt").is_file()
    # Nothing was built for a refused request.
    assert not (tmp_path / "cache").exists()
    # An earlier build in the same place is replaced.
    first, _ = build_testbed(tiny(), tmp_path / "tb", progress=False, echo=lambda *_: None)
    again, _ = build_testbed(tiny(), tmp_path / "tb", progress=False, echo=lambda *_: None)
    assert again == first and (again / "testbed.json").is_file()


def test_the_rl_pool_is_disjoint_from_held_out_sets_and_leaves_pretraining_alone():
    plain = load_testbed_config("ci")
    pooled = load_testbed_config("ci", overrides=["data.rl_pool_per_tier=50"])
    sets, excluded = held_out_sets(pooled)
    sets0, excluded0 = held_out_sets(plain)
    assert excluded == excluded0 and "countdown_rl_pool" not in sets0
    assert {k: [p.id for p in v] for k, v in sets0.items()} == \
        {k: [p.id for p in v] for k, v in sets.items() if k != "countdown_rl_pool"}
    pool = {_problem_key(p) for p in sets["countdown_rl_pool"]}
    assert 0 < len(pool) <= 50 * len(pooled.data.countdown_tiers)
    assert not pool & {_problem_key(p) for p in sets["countdown_eval"] + sets["countdown_rl"]}


def test_held_out_problems_carry_a_worked_reference_that_scores_one():
    from es_llm.tasks import TaskConfig, build_task

    sets, _ = held_out_sets(load_testbed_config("ci"))
    task = build_task(TaskConfig(name="countdown"))
    problems = sets["countdown_rl"][:20]
    scores = task.score_many([(p, p.meta["reference"]) for p in problems])
    assert all(s.reward == 1.0 for s in scores)
    assert all(record(p)["reference"] == p.meta["reference"] for p in problems)
    task.close()


def test_teachers_are_deterministic_share_the_tokenizer_and_cache_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("ES_LLM_CACHE", str(tmp_path / "cache"))
    quiet = dict(progress=False, echo=lambda *_: None)
    first, info = build_testbed(tiny(), tmp_path / "a", **quiet)
    teachers = first / "teachers"
    assert set(info["teachers"]) == {"strong", "weak_base", "weak_rl"}
    student = AutoModelForCausalLM.from_pretrained(first)
    strong = AutoModelForCausalLM.from_pretrained(teachers / "strong")
    assert strong.num_parameters() > student.num_parameters()
    weak = AutoModelForCausalLM.from_pretrained(teachers / "weak_base")
    # The ci weak model has the student's shape but less training (a smaller one would solve
    # nothing at this size); the default one is smaller.
    assert weak.num_parameters() <= student.num_parameters()
    default = load_testbed_config("default")
    tok = AutoTokenizer.from_pretrained(first)
    sizes = {name: make_model(replace(default, model=shape), tok).num_parameters()
             for name, shape in (("student", default.model),
                                 ("strong", default.teachers.strong.model),
                                 ("weak", default.teachers.weak.model))}
    assert sizes["weak"] < sizes["student"] < sizes["strong"]
    vocab = AutoTokenizer.from_pretrained(first).get_vocab()
    for name in ("strong", "weak_base", "weak_rl"):
        assert AutoTokenizer.from_pretrained(teachers / name).get_vocab() == vocab
    # Built again from scratch: the same bytes.
    monkeypatch.setenv("ES_LLM_CACHE", str(tmp_path / "cache2"))
    again, _ = build_testbed(tiny(), tmp_path / "b", **quiet)
    for name in ("strong", "weak_base", "weak_rl"):
        assert weights_digest(teachers / name) == weights_digest(again / "teachers" / name)
    # Changing the weak pair's settings rebuilds only the weak pair.
    said = []
    build_testbed(tiny(0, "teachers.weak.rl_lr=0.02"), tmp_path / "c", progress=False,
                  echo=said.append)
    assert any("testbed ci found in cache" in m for m in said)
    assert any("teacher 'strong'" in m and "found in cache" in m for m in said)
    assert any(m.startswith("building teachers 'weak_base'") for m in said)


def test_short_rl_moves_the_weak_model_along_the_reward():
    """``short_rl`` with a stub task that rewards even-length completions: the REINFORCE
    steps change the weights, and skip groups whose rewards are all equal."""
    from dataclasses import replace as dc_replace
    from es_llm.tasks.base import Problem, Score
    from es_llm.testbed.teachers import short_rl
    from es_llm.testbed.tokenizer import build_tokenizer
    from es_llm.testbed.train import make_model

    class EvenLength:
        def score_many(self, pairs):
            return [Score(reward=float(len(text) % 2 == 0), correct=len(text) % 2 == 0)
                    for _, text in pairs]

    cfg = tiny(0, "teachers.weak.rl_steps=3", "teachers.weak.rl_group=4")
    cfg = dc_replace(cfg, report=dc_replace(cfg.report, max_tokens=6))
    tok = build_tokenizer()
    model = make_model(cfg, tok)
    before = [p.detach().clone() for p in model.parameters()]
    problems = [Problem(id=f"p{i}", prompt=f"nums {i} make {i}\n", gold=None) for i in range(3)]
    stats = short_rl(model, tok, EvenLength(), problems, cfg, progress=False)
    assert stats["rl_steps"] == 3 and 0 <= stats["reward_first"] <= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_concurrent_builds_of_one_key_build_once_and_leave_no_temporaries(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    overrides = ["train.steps=6", "data.eval_per_tier=3", "data.rl_per_tier=3",
                 "report.samples=2", "report.max_tokens=8", "teachers.enabled=false"]
    cache = tmp_path / "cache"
    key = f"ci-{load_testbed_config('ci', overrides=overrides).fingerprint()}"
    # What a builder killed mid-build leaves: a staging folder beside the key.
    stale = cache / "testbed" / f".{key}.dead1234"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    env = dict(os.environ, ES_LLM_CACHE=str(cache),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = [subprocess.Popen([sys.executable, "-m", "es_llm", "testbed", "--size", "ci",
                               "--out", str(tmp_path / f"out{i}"), "--no-progress", *overrides],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    said = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    built = [s.startswith(f"building testbed ci ({key})") for s in said]
    assert sum(built) == 1, said
    waited = said[built.index(False)]
    assert "found in cache" in waited
    assert weights_digest(tmp_path / "out0") == weights_digest(tmp_path / "out1")
    leftovers = [p.name for p in (cache / "testbed").iterdir()
                 if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []
