"""Solved sets, their overlap, progressions/regressions, and the accuracy histogram."""

from __future__ import annotations

import numpy as np
import pytest

from es_llm.metrics.coverage import (
    accuracy_histogram,
    overlap,
    progressions_regressions,
    share_below,
    solved_set,
)


def test_solved_set():
    correct = [[False, True], [False, False], np.array([True]), []]
    assert solved_set(["a", "b", "c", "d"], correct) == {"a", "c"}
    with pytest.raises(ValueError):
        solved_set(["a", "a", "c", "d"], correct)  # duplicate id
    with pytest.raises(ValueError):
        solved_set(["a", "b"], correct)


def test_overlap_hand_example():
    result = overlap({"p1", "p2", "p3"}, {"p3", "p2", "p4"})
    assert result["both"] == ["p2", "p3"]
    assert result["only_a"] == ["p1"] and result["only_b"] == ["p4"]
    assert (result["num_a"], result["num_b"], result["num_both"], result["num_union"]) == (3, 3, 2, 4)
    # |A & B| / |A | B| = 2 / 4
    assert result["jaccard"] == 0.5
    assert overlap(set(), set())["jaccard"] == 1.0
    assert overlap({"x"}, set())["jaccard"] == 0.0


def test_progressions_regressions_hand_example():
    ids = ["p1", "p2", "p3", "p4"]
    model = [[0, 1], [0, 0], [1, 1], [0, 0]]
    reference = [[0, 0], [1, 0], [1, 0], [0, 0]]
    result = progressions_regressions(ids, model, reference)
    assert result["progressions"] == ["p1"]  # reference 0/2, model 1/2
    assert result["regressions"] == ["p2"]  # reference 1/2, model 0/2
    assert (result["num_progressions"], result["num_regressions"]) == (1, 1)
    # deltas: p1 +0.5, p2 -0.5, p3 +0.5, p4 0 -> mean 0.5 / 4 = 0.125
    delta = result["accuracy_delta"]
    assert delta["mean"] == pytest.approx(0.125)
    assert (delta["num_up"], delta["num_down"], delta["num_same"]) == (2, 1, 1)


def test_progressions_regressions_different_sample_counts():
    # 1/3 and 2/6 are the same accuracy, which must count as "same", not as a float wobble.
    result = progressions_regressions(["q"], [[1, 0, 0]], [[1, 1, 0, 0, 0, 0]])
    assert result["accuracy_delta"]["num_same"] == 1
    assert result["accuracy_delta"]["mean"] == pytest.approx(0.0)


def test_accuracy_histogram_hand_example():
    # n = 20 per problem; c = 0, 1, 2, 6, 7, 20 -> accuracy 0, .05, .1, .3, .35, 1.0
    correct = [[True] * c + [False] * (20 - c) for c in (0, 1, 2, 6, 7, 20)]
    hist = accuracy_histogram(correct)
    # bins: "0" | (0,.1] gets .05 and .1 | (.2,.3] gets .3 | (.3,.4] gets .35 | (.9,1] gets 1.0
    assert hist["counts"] == [1, 2, 0, 1, 1, 0, 0, 0, 0, 0, 1]
    assert hist["labels"][:3] == ["0", "(0,0.1]", "(0.1,0.2]"] and hist["labels"][-1] == "(0.9,1]"
    assert hist["shares"][1] == pytest.approx(2 / 6)
    assert hist["share_unsolved"] == pytest.approx(1 / 6)
    assert hist["num_problems"] == 6
    assert sum(hist["counts"]) == 6


def test_accuracy_histogram_right_closed_edges_are_exact():
    # 3/10 = 0.3 belongs to (0.2, 0.3]; in floats 0.3 * 10 = 3.0000000000000004 would not.
    hist = accuracy_histogram([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
    assert hist["counts"][3] == 1
    # with 4 bins, 1/4 sits in (0, 0.25] and 3/4 in (0.5, 0.75]
    assert accuracy_histogram([[1, 0, 0, 0], [1, 1, 1, 0]], num_bins=4)["counts"] == [0, 1, 0, 1, 0]
    with pytest.raises(ValueError):
        accuracy_histogram([[]])


def test_share_below():
    # accuracies 0, 1/64 = 0.0156, 2/64 = 0.03125, 1 -> two of four below 2%
    correct = [[True] * c + [False] * (64 - c) for c in (0, 1, 2, 64)]
    assert share_below(correct, 0.02) == 0.5
    # strict: accuracy exactly 2/64 is not below 2/64
    assert share_below(correct, 2 / 64) == 0.5
    assert share_below([], 0.5) == 0.0
