"""The capability table: greedy accuracy beside sampled pass@1, the sharpening gap and the
problems newly solved greedily, hand-checked on four problems."""

from __future__ import annotations

import math

import numpy as np
import pytest

from es_llm.compare.capability import capability
from es_llm.compare.samples import load_samples

from test_compare_analysis import write_samples


def sets(tmp_path, view, tables, temperature):
    return [load_samples(name, write_samples(tmp_path / view / name, table,
                                             temperature=temperature))
            for name, table in tables.items()]


def test_four_problems_by_hand(tmp_path):
    # Greedy: base solves p0, p1; the trained model (two seeds) keeps p0, loses p1 in seed 0,
    # and newly solves p2 (both seeds) and p3 (seed 1).
    greedy = {"base": [[1], [1], [0], [0]],
              "rl@0": [[1], [0], [1], [0]],
              "rl@1": [[1], [1], [1], [1]]}
    # Sampled at T = 1, 4 samples each. Answers: correct "gold", wrong "w0/w1/w2" by index.
    sampled = {"base": [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]],
               "rl@0": [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]],
               "rl@1": [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]}
    views = [{"data": "held-out", "temperature": 0.0, "sets": sets(tmp_path, "g", greedy, 0.0)},
             {"data": "held-out", "temperature": 1.0, "sets": sets(tmp_path, "t", sampled, 1.0)}]
    cap = capability(views, "base", np.random.default_rng(0), 200)
    assert cap["temperatures"] == ["T=1"]
    (entry,) = cap["sets"]
    assert entry["num_problems"] == 4
    base, rl = entry["methods"]["base"], entry["methods"]["rl"]
    assert base["greedy"] == pytest.approx(0.5)
    assert rl["greedy"] == pytest.approx((2 / 4 + 4 / 4) / 2)
    # pass@1 = mean correct share; pass@4 = share of problems with any correct sample.
    assert base["sampled"]["T=1"]["pass@1"] == pytest.approx((2 + 1 + 0 + 1) / 16)
    assert base["sampled"]["T=1"]["pass@n"] == pytest.approx(3 / 4)
    assert rl["sampled"]["T=1"]["pass@1"] == pytest.approx(((4 + 2 + 3) + (4 + 3 + 2)) / 32)
    assert rl["sampled"]["T=1"]["pass@n"] == pytest.approx(3 / 4)
    assert base["gap"]["T=1"] == pytest.approx(0.5 - 4 / 16)
    assert rl["gap"]["T=1"] == pytest.approx(0.75 - 18 / 32)
    # Entropy of the answers per problem, "gold" plus wrong answers w{s % 3}.
    h = lambda *counts: -sum(c / 4 * math.log(c / 4) for c in counts)
    base_h = np.mean([h(2, 1, 1), h(1, 1, 1, 1), h(2, 1, 1), h(1, 1, 1, 1)])
    assert base["sampled"]["T=1"]["entropy"] == pytest.approx(base_h)
    vs = entry["vs_reference"]["rl"]
    assert vs["newly_solved"] == pytest.approx((1 + 2) / 2)
    assert vs["lost"] == pytest.approx((1 + 0) / 2)
    assert vs["seed_values"] == {"rl@0": {"newly_solved": 1, "lost": 1},
                                 "rl@1": {"newly_solved": 2, "lost": 0}}
    assert vs["greedy"]["diff"] == pytest.approx(0.75 - 0.5)


def test_a_set_without_a_greedy_view_has_no_gap(tmp_path):
    table = {"base": [[1, 0], [0, 0]], "es": [[1, 1], [0, 1]]}
    views = [{"data": "never-seen", "temperature": 0.6, "sets": sets(tmp_path, "a", table, 0.6)}]
    (entry,) = capability(views, "base", np.random.default_rng(0), 100)["sets"]
    assert entry["methods"]["es"]["greedy"] is None
    assert entry["methods"]["es"]["gap"] == {"T=0.6": None}
    assert entry["vs_reference"] == {}


def test_the_figure_draws_a_set_without_a_greedy_view(tmp_path):
    from es_llm.compare.capability import blocks, figure

    table = {"base": [[1, 0], [0, 0]], "es": [[1, 1], [0, 1]]}
    views = [{"data": "never-seen", "temperature": 0.6, "sets": sets(tmp_path, "a", table, 0.6)}]
    cap = capability(views, "base", np.random.default_rng(0), 100)
    name = figure(cap, tmp_path / "capability.png")
    assert name == "capability.png" and (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert blocks({"capability": cap}, {"capability": name})[-1].file == name
