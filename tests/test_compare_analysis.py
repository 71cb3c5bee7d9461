"""The comparison's numbers: hand-computed cases, agreement with the metrics functions, and the
checks that refuse unfair comparisons."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from es_llm.compare.analysis import (
    band,
    compare_sets,
    crossover_k,
    paired,
    passk_table,
    shared_resamples,
)
from es_llm.compare.samples import align, load_samples
from es_llm.errors import BadInput
from es_llm.metrics import bootstrap_ci, pass_at_k_per_problem


def write_samples(folder, correct_P_N, answers_P_N=None, ids=None, n=None, temperature=1.0,
                  prompts=None):
    """An eval folder (samples.jsonl + config.yaml) from a P x N table of booleans."""
    folder.mkdir(parents=True, exist_ok=True)
    correct_P_N = np.asarray(correct_P_N, dtype=bool)
    ids = ids or [f"p{i}" for i in range(len(correct_P_N))]
    rows = []
    for p, row in enumerate(correct_P_N):
        for s, ok in enumerate(row):
            ans = answers_P_N[p][s] if answers_P_N is not None else ("gold" if ok else f"w{s % 3}")
            rows.append({"problem_id": ids[p], "sample_index": s,
                         "prompt": prompts[p] if prompts else f"prompt {ids[p]}",
                         "completion": f"work {ans} <answer>{ans}</answer>", "correct": bool(ok),
                         "reward": float(ok), "answer": ans, "answer_key": ans,
                         "solution_key": f"{ans}-{s % 2}" if ok else ans, "difficulty": p % 2})
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "task": {"name": "countdown"},
        "sampling": {"n": n or correct_P_N.shape[1], "temperature": temperature, "top_p": 1.0,
                     "max_tokens": 64, "seed": 0}}))
    return folder


def test_crossover_is_the_first_k_where_the_trailing_model_draws_ahead():
    ks = [1, 2, 3, 4]
    assert crossover_k([0.5, 0.6, 0.7, 0.8], [0.3, 0.5, 0.7, 0.9], ks) == 4  # tie at 3 is no flip
    assert crossover_k([0.3, 0.5, 0.71, 0.9], [0.5, 0.6, 0.7, 0.8], ks) == 3
    assert crossover_k([0.5, 0.6], [0.4, 0.5], [1, 2]) is None
    assert crossover_k([0.5, 0.6], [0.5, 0.7], [1, 2]) is None  # tied at k = 1


def test_paired_difference_calls_a_side_only_when_the_interval_excludes_zero():
    rng = np.random.default_rng(0)
    w = shared_resamples(200, rng, 2000)
    a = np.r_[np.ones(120), np.zeros(80)]
    clear = paired(a, np.r_[np.ones(60), np.zeros(140)], w)
    assert clear["diff"] == pytest.approx(0.3) and clear["ahead"] == "a"
    assert clear["ci95"][0] > 0.2 and clear["ci95"][1] < 0.4
    rng2 = np.random.default_rng(1)
    noisy = paired(rng2.random(200) < 0.5, rng2.random(200) < 0.5, w)
    assert noisy["ahead"] == ("tie" if noisy["ci95"][0] <= 0 <= noisy["ci95"][1] else noisy["ahead"])
    behind = paired(np.zeros(200), a, w)
    assert behind["ahead"] == "b" and behind["diff"] == pytest.approx(-0.6)


def test_band_is_the_metrics_bootstrap_interval_on_every_column():
    values = np.random.default_rng(3).random(300)
    resamples = shared_resamples(300, np.random.default_rng(4), 4000)
    lo, hi = band(np.stack([values, 2 * values], axis=1), resamples)
    # The band's resamples are those of a child of the generator it was given.
    child = np.random.default_rng(4).spawn(1)[0]
    assert (lo[0], hi[0]) == bootstrap_ci(values, child, num_resamples=4000)
    # Every column is resampled the same way, so doubling the values doubles the bounds.
    assert lo[1] == pytest.approx(2 * lo[0], rel=1e-12)
    assert hi[1] == pytest.approx(2 * hi[0], rel=1e-12)
    # The same resamples again give the same band; another call of shared_resamples another.
    assert band(values[:, None], resamples) == (lo[:1], hi[:1])
    other = band(values[:, None], shared_resamples(300, np.random.default_rng(4), 4000))
    assert other == (lo[:1], hi[:1])
    rng = np.random.default_rng(4)
    first, second = shared_resamples(300, rng, 4000), shared_resamples(300, rng, 4000)
    assert band(values[:, None], first) != band(values[:, None], second)
    with pytest.raises(ValueError, match="299 problems"):
        band(values[:-1, None], resamples)


def test_passk_table_is_the_unbiased_estimator_for_every_k():
    correct = np.random.default_rng(0).random((7, 6)) < 0.3
    table = passk_table(correct, list(range(1, 7)))
    for k in range(1, 7):
        assert np.array_equal(table[:, k - 1], pass_at_k_per_problem(correct, k))
    assert np.allclose(table[:, 0], correct.mean(axis=1))


def test_compare_sets_groups_seeds_and_counts_overlaps_by_hand(tmp_path):
    # 4 problems x 2 samples. base solves p0 twice and p1 once; es@0 solves p0, p2;
    # es@1 solves p0 only; grpo solves p1 and p3.
    base = [[1, 1], [1, 0], [0, 0], [0, 0]]
    es0 = [[1, 0], [0, 0], [0, 1], [0, 0]]
    es1 = [[1, 1], [0, 0], [0, 0], [0, 0]]
    grpo = [[0, 0], [1, 1], [0, 0], [1, 0]]
    sets = align([load_samples(name, write_samples(tmp_path / name, table))
                  for name, table in (("base", base), ("es@0", es0), ("es@1", es1),
                                      ("grpo", grpo))])
    comp = compare_sets(sets, "base", np.random.default_rng(0), num_resamples=200)
    es = comp["methods"]["es"]
    # Seed-averaged pass@1 per problem: p0 (0.5 + 1) / 2, p2 0.25 -> mean 1 / 4.
    assert es["passk"]["mean"][0] == pytest.approx((0.75 + 0.25) / 4)
    assert es["passk"]["seed_values"] == {"es@0": [0.25, 0.5], "es@1": [0.25, 0.25]}
    assert es["solved"] == {"mean": 1.5, "seed_values": {"es@0": 2, "es@1": 1}}
    # es@0 gains p2 and loses p1; es@1 loses p1: progressions 0.5, regressions 1 on average.
    assert es["vs_base"]["num_progressions"] == 0.5 and es["vs_base"]["num_regressions"] == 1.0
    assert comp["models"]["es@0"]["vs_base"]["regressions"] == ["p1"]
    # The base never solves p2 and p3: es@0 solves p2, es@1 neither, grpo p3.
    assert comp["models"]["es@0"]["vs_base"]["base_never_solved"] == 2
    assert es["vs_base"]["progression_share"] == pytest.approx((0.5 + 0.0) / 2)
    assert comp["methods"]["grpo"]["vs_base"]["progression_share"] == 0.5
    pairs = {(p["a"], p["b"]): p for p in comp["pairs"]}
    assert list(pairs) == [("es", "base"), ("grpo", "base"), ("es", "grpo")]
    # es vs grpo overlap, averaged over (es@0, grpo) and (es@1, grpo): only es {p0,p2} / {p0}.
    lap = pairs[("es", "grpo")]["overlap"]
    assert lap == {"num_only_a": 1.5, "num_only_b": 2.0, "num_both": 0.0, "num_neither": 0.5}
    # pass@1: es 0.25, base (1 + 0.5) / 4, grpo (1 + 0.5) / 4.
    assert pairs[("es", "base")]["pass@1"]["diff"] == pytest.approx(0.25 - 0.375)
    assert pairs[("grpo", "base")]["pass@1"]["diff"] == pytest.approx(0.0)
    assert pairs[("grpo", "base")]["pass@1"]["ahead"] == "tie"
    # pass@2: es (1 + 0.5) / 4 seed-averaged, base 0.5: es trails at k = 1 and ties at k = 2.
    assert pairs[("es", "base")]["pass@2"]["diff"] == pytest.approx(0.375 - 0.5)
    assert pairs[("es", "base")]["crossover_k"] is None


def test_refuses_different_problem_sets_and_different_n(tmp_path):
    a = load_samples("base", write_samples(tmp_path / "a", [[1, 0], [0, 1]]))
    other_ids = load_samples("es", write_samples(tmp_path / "b", [[1, 0], [0, 1]], ids=["p0", "q9"]))
    with pytest.raises(BadInput, match=r"different problem sets.*1 of base's 2 problems are missing \(e.g. p1\)"):
        align([a, other_ids])
    three = load_samples("es", write_samples(tmp_path / "c", [[1, 0, 1], [0, 1, 1]]))
    with pytest.raises(BadInput, match="n=3 samples per problem.*n=2"):
        align([a, three])
    hot = load_samples("es", write_samples(tmp_path / "d", [[1, 0], [0, 1]], temperature=0.7))
    with pytest.raises(BadInput, match="temperature=0.7"):
        align([a, hot])
    moved = load_samples("es", write_samples(tmp_path / "e", [[1, 0], [0, 1]], prompts=["x", "y"]))
    with pytest.raises(BadInput, match="different prompt"):
        align([a, moved])


def test_refuses_ragged_and_malformed_sample_files(tmp_path):
    folder = write_samples(tmp_path / "a", [[1, 0], [0, 1]])
    lines = (folder / "samples.jsonl").read_text().splitlines()
    (folder / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(BadInput, match="different numbers of samples per problem"):
        load_samples("x", folder)
    (folder / "samples.jsonl").write_text('{"problem_id": "p0"}\n')
    with pytest.raises(BadInput, match="lacks sample_index, completion, correct"):
        load_samples("x", folder)
    with pytest.raises(BadInput, match="not valid"):
        load_samples("bad name!", write_samples(tmp_path / "b", [[1]]))
