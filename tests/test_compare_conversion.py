"""The conversion study's table (``es_llm.compare.conversion``): the recovered share by hand,
its degenerate cases, its paired interval, and the section on sample files with tiers."""

from __future__ import annotations

import numpy as np
import pytest

from es_llm.compare.config import CompareConfig, ConversionArm
from es_llm.compare.conversion import (blocks, check, compute, paired_difference,
                                       recovered_share, share_with_ci)
from es_llm.compare.samples import load_samples
from es_llm.compare.section import CheckInput, SectionInput, Source, sections
from es_llm.config import load_config
from es_llm.errors import BadInput
from es_llm.report import to_markdown
from test_compare_analysis import write_samples


def test_the_recovered_share_is_the_gain_over_the_conversions_loss():
    # Loss 0.6 - 0.2 = 0.4; RL gains 0.4 - 0.2 = 0.2: half of it.
    assert recovered_share([0.5, 0.7], [0.2, 0.2], [0.3, 0.5]) == pytest.approx(0.5)
    # RL past the unconverted model (gain 0.6 on loss 0.4), and RL that loses more (-0.2).
    assert recovered_share([0.5, 0.7], [0.2, 0.2], [0.8, 0.8]) == pytest.approx(1.5)
    assert recovered_share([0.5, 0.7], [0.2, 0.2], [0.0, 0.0]) == pytest.approx(-0.5)


@pytest.mark.parametrize("converted", [[0.6, 0.6], [0.7, 0.9]])
def test_a_conversion_that_lost_nothing_has_no_share_and_says_so(converted):
    """Equal (a zero loss) or better after the conversion: no share, no interval, the loss
    reported, and the table says why instead of a number."""
    assert recovered_share([0.5, 0.7], converted, [0.9, 0.9]) is None
    out = share_with_ci([0.5, 0.7], converted, [0.9, 0.9], np.random.default_rng(0), 50)
    assert out["value"] is None and out["ci95"] is None
    assert out["loss"] == pytest.approx(0.6 - np.mean(converted))
    row = {"tier": "all", "problems": 2, "pass1": {"full": 0.6, "converted": 0.6, "rl": 0.9},
           "share": out, "vs_rl_full": None}
    comp = {"conversion": {"w8": {"models": {"full": "base", "converted": "c", "rl": "r"},
                                  "rows": [row]}}}
    assert "- (no conversion loss:" in to_markdown(blocks(comp, {}))


def test_the_interval_leaves_out_resamples_where_the_conversion_lost_nothing():
    """Two problems. Resampled {1, 1}: loss 1, gain 0.5, share 0.5; {1, 2} or {2, 1}: loss
    0.25, gain 0.25, share 1; {2, 2}: the conversion gains 0.5, undefined. The interval lies
    in [0.5, 1] and about a quarter of the resamples are counted undefined."""
    out = share_with_ci([1.0, 0.0], [0.0, 0.5], [0.5, 0.5], np.random.default_rng(0), 400)
    assert out["value"] == pytest.approx(1.0)
    assert 0.5 <= out["ci95"][0] <= out["ci95"][1] <= 1.0
    assert 60 < out["undefined_resamples"] < 140


def test_a_paired_difference_keeps_the_pairs():
    """Every problem differs by exactly 0.1, so every resample's mean difference is 0.1."""
    a = np.array([0.9, 0.5, 0.3, 0.7])
    out = paired_difference(a, a - 0.1, np.random.default_rng(0), 100)
    assert out["diff"] == pytest.approx(0.1) and out["ci95"] == pytest.approx([0.1, 0.1])


@pytest.fixture()
def evals(tmp_path):
    """Eight problems (tiers 0 and 1 alternate), four samples each: pass@1 per problem known."""
    def folder(name, counts_P):
        return write_samples(tmp_path / name, [[s < c for s in range(4)] for c in counts_P])
    return {"base": folder("base", [4, 4, 2, 2, 4, 4, 2, 2]),
            "sft": folder("sft", [0, 2, 0, 2, 0, 2, 0, 2]),
            "rl@0": folder("rl0", [2, 2, 2, 2, 2, 2, 2, 2]),
            "rl@1": folder("rl1", [4, 2, 0, 2, 4, 2, 0, 2]),
            "full": folder("full", [4, 4, 4, 4, 4, 4, 4, 4])}


def test_the_section_reads_every_tier_and_the_seed_mean_of_a_method(evals):
    cfg = CompareConfig(conversion={"w8": ConversionArm(converted="sft", rl="rl",
                                                        rl_full="full")})
    assert [n for n, _ in sections(cfg)][-1] == "conversion"
    sets = tuple(load_samples(name, path) for name, path in evals.items())
    sources = tuple(Source(name, path, None) for name, path in evals.items())
    comp = compute(SectionInput(cfg, sources, sets, evals["base"], False, print)).to_json()
    rows = {r["tier"]: r for r in comp["conversion"]["w8"]["rows"]}
    assert [r["problems"] for r in rows.values()] == [4, 4, 8]
    # Tier 0 (problems 0, 2, 4, 6): base 0.75, sft 0, rl seeds 0.5 and 0.5 -> 0.5.
    # Tier 1: base 0.75, sft 0.5, rl 0.5 -> nothing recovered of 0.25.
    assert rows["0"]["pass1"] == pytest.approx({"full": 0.75, "converted": 0.0, "rl": 0.5,
                                                "rl_full": 1.0})
    assert rows["0"]["share"]["value"] == pytest.approx(0.5 / 0.75)
    assert rows["1"]["share"]["value"] == pytest.approx(0.0)
    assert rows["all"]["share"]["value"] == pytest.approx((0.5 - 0.25) / (0.75 - 0.25))
    assert rows["all"]["vs_rl_full"]["diff"] == pytest.approx(-0.5)
    table = to_markdown(blocks(comp, {}))
    assert "| all | 8 | 75.0% | 25.0% | 50.0% | 100.0% | 50.0% [" in table
    assert "rl - full [95% CI]" in table


def test_an_arm_naming_a_model_not_compared_is_refused(evals):
    cfg = CompareConfig(conversion={"w8": ConversionArm(converted="sft", rl="grpo")})
    sources = tuple(Source(name, path, None) for name, path in evals.items())
    with pytest.raises(BadInput, match="conversion arm w8 names 'grpo', which is not compared"):
        check(CheckInput(cfg, sources, {}))


@pytest.mark.parametrize("setting, message", [
    (["conversion.w8.converted=sft"], "needs full, converted and rl"),
    (["conversion.w8.converted=sft", "conversion.w8.rl=sft"], "four different models"),
    (["conversion.w.8.converted=sft"], "unknown config key"),
    (["conversion={w-8: {converted: a, rl: b}}"], "letters, digits and _")])
def test_bad_arms_are_refused_at_load(setting, message):
    with pytest.raises(BadInput, match=message):
        load_config(CompareConfig, overrides=setting)
