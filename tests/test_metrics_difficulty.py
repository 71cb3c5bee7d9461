"""Difficulty metrics by hand: DRG's AUC with weights and ties, its invariance to accuracy,
difficulty bins, per-bin accuracy and paired gains, the rarely-solved share."""

from __future__ import annotations

import math

import numpy as np
import pytest

from es_llm.metrics.difficulty import (accuracy_by_bin, bin_labels, difficulty_bins, drg,
                                       drg_auc, paired_difference_by_bin, rarely_solved_share)


def test_failing_only_the_hard_items_is_plus_one_and_the_easy_ones_minus_one():
    assert drg([0.9, 0.1], [0.0, 1.0])["value"] == 1.0
    assert drg([0.9, 0.1], [1.0, 0.0])["value"] == -1.0


def test_auc_by_hand_with_a_mixed_ranking():
    # Failed items 1 and 3 (e .2, .4) against solved 0 and 2 (e .1, .3): 3 of 4 pairs
    # have the failed item harder.
    assert drg_auc([0.1, 0.2, 0.3, 0.4], [1, 0, 1, 0]) == pytest.approx(0.75)


def test_pair_weights_use_per_item_accuracy_and_ties_count_half():
    # acc .75 / .25: pair (0 fails, 1 solved) weight .25 * .25, easier; (1 fails, 0 solved)
    # weight .75 * .75, harder: AUC = .5625 / .625.
    assert drg_auc([0.2, 0.8], [0.75, 0.25]) == pytest.approx(0.9)
    assert drg_auc([0.2, 0.8], [0.5, 0.5]) == pytest.approx(0.5)
    assert drg_auc([0.5, 0.5], [0.0, 1.0]) == 0.5
    assert math.isnan(drg_auc([0.1, 0.9], [1.0, 1.0]))  # nothing failed: undefined


def test_the_same_ranking_of_failures_gives_the_same_drg_at_another_accuracy():
    e = [0.1, 0.2, 0.3, 0.4]
    acc = [1, 0, 1, 0]  # accuracy 0.5
    # Every solved item twice: accuracy 2/3, the same failures against the same solves.
    e2, acc2 = e + [0.1, 0.3], acc + [1, 1]
    assert np.mean(acc2) != np.mean(acc)
    assert drg(e2, acc2)["value"] == pytest.approx(drg(e, acc)["value"]) == pytest.approx(0.5)
    # Failing only the hardest one or the hardest two: +1 at accuracy 0.75 and 0.5.
    assert drg(e, [1, 1, 1, 0])["value"] == drg(e, [1, 1, 0, 0])["value"] == 1.0


def test_drg_interval_brackets_the_value():
    rng = np.random.default_rng(0)
    e = rng.random(60)
    acc = (rng.random(60) > e).astype(float)  # harder items fail more often
    out = drg(e, acc, np.random.default_rng(1), 500)
    lo, hi = out["ci95"]
    assert lo <= out["value"] <= hi and out["value"] > 0.3


def test_bins_labels_and_per_bin_accuracy():
    e = 1 - np.array([8, 6, 3, 0, 0]) / 8  # failure rates 0, .25, .625, 1, 1
    bins = difficulty_bins(e)
    assert bins.tolist() == [0, 1, 2, 4, 4]
    assert bin_labels() == ["<0.25", "0.25-0.5", "0.5-0.75", "0.75-0.95", ">=0.95"]
    rows = accuracy_by_bin(bins, [1.0, 0.5, 0.5, 0.0, 1.0], 5)
    assert [r["accuracy"] for r in rows] == [1.0, 0.5, 0.5, None, 0.5]
    assert [r["problems"] for r in rows] == [1, 1, 1, 0, 2]


def test_paired_difference_by_bin_by_hand():
    bins = [0, 0, 1, 1]
    out = paired_difference_by_bin(bins, [1.0, 0.5, 0.25, 0.75], [0.5, 0.5, 0.25, 0.25], 3,
                                   np.random.default_rng(0), 200)
    assert out[0]["difference"] == pytest.approx(0.25) and out[1]["difference"] == 0.25
    assert out[0]["ci95"][0] <= 0.25 <= out[0]["ci95"][1]
    assert out[2] == {"bin": 2, "problems": 0, "difference": None, "ci95": None}


def test_rarely_solved_share():
    assert rarely_solved_share([1, 1, 0, 1], [0.0, 0.5, 0.0, 0.04]) == pytest.approx(2 / 3)
    assert rarely_solved_share([0, 0], [0.0, 0.5]) is None


@pytest.mark.parametrize("call", [
    lambda: drg_auc([0.1, 0.2], [1.0]),
    lambda: drg_auc([0.1, 0.2], [1.5, 0.0]),
    lambda: difficulty_bins([0.1], edges=(0.5, 0.2)),
])
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError):
        call()
