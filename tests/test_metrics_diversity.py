"""Answer diversity, distinct-n, BLEU / self-BLEU, distinct correct solutions, and the report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from es_llm.metrics.diversity import (
    answer_entropy,
    distinct_answers,
    distinct_correct_solutions,
    distinct_n,
    diversity_report,
    self_bleu,
    sentence_bleu,
    tokenize,
)


def test_tokenize():
    assert tokenize("Hello, world! x=3.5") == ["Hello", ",", "world", "!", "x", "=", "3", ".", "5"]
    assert tokenize("  ") == []


def test_distinct_answers():
    result = distinct_answers([["a", "a", None], ["x", "y", "z"], [None], []])
    # counts 1, 3, 0, and NaN for the empty problem; mean (1 + 3 + 0) / 3
    np.testing.assert_array_equal(result["counts_P"][:3], [1, 3, 0])
    assert math.isnan(result["counts_P"][3])
    assert result["mean"] == pytest.approx(4 / 3)


def test_answer_entropy_hand_values():
    result = answer_entropy([["a", "a", "b", "b"], ["a", "a", "a"], ["a", "b", "c", "c"], ["a", None, None, "a"], []])
    h = result["entropy_P"]
    # two equally likely answers: ln 2
    assert h[0] == pytest.approx(math.log(2))
    assert h[1] == 0.0
    # 1/4, 1/4, 1/2: -(2 * 1/4 ln 1/4 + 1/2 ln 1/2) = 1/2 ln 4 + 1/2 ln 2 = 1.5 ln 2
    assert h[2] == pytest.approx(1.5 * math.log(2))
    # None is its own outcome: {a: 2, none: 2} -> ln 2
    assert h[3] == pytest.approx(math.log(2))
    assert math.isnan(h[4])
    assert result["exp_entropy_P"][0] == pytest.approx(2.0)
    # plurality share: most common non-None key over all samples
    np.testing.assert_allclose(result["plurality_share_P"][:4], [0.5, 1.0, 0.5, 0.5])
    assert result["mean_entropy"] == pytest.approx((math.log(2) * 2 + 1.5 * math.log(2)) / 4)
    # a literal answer "None" is not the missing-answer outcome
    assert answer_entropy([["None", None]])["entropy_P"][0] == pytest.approx(math.log(2))


def test_distinct_n_hand_values():
    texts = [["a b c", "a b d"], ["x"]]
    # bigrams: (a,b) (b,c) (a,b) (b,d) -> 3 unique / 4 total; a one-token problem has none -> NaN
    d2 = distinct_n(texts, 2)
    assert d2["values_P"][0] == pytest.approx(0.75)
    assert math.isnan(d2["values_P"][1])
    assert d2["mean"] == pytest.approx(0.75)
    # unigrams: a b c a b d -> 4 unique / 6 total; problem 2: 1/1
    d1 = distinct_n(texts, 1)
    np.testing.assert_allclose(d1["values_P"], [4 / 6, 1.0])
    # n-grams never straddle two samples: "c a" is not a bigram here
    assert distinct_n([["a b c", "a"]], 2)["values_P"][0] == 1.0


def test_sentence_bleu_hand_pair():
    hyp = tokenize("the cat sat on the mat")
    ref = tokenize("the cat is on the mat")
    # p1: the x2, cat, on, mat match, sat does not -> 5/6
    # p2: the-cat, on-the, the-mat of 5 -> 3/5
    # p3: on-the-mat of 4 -> 1/4
    # p4: 0 of 3 -> floored to 0.1/3; c = r = 6 so BP = 1
    assert sentence_bleu(hyp, [ref], max_n=3) == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3))  # = 0.5
    assert sentence_bleu(hyp, [ref], max_n=3) == pytest.approx(0.5)
    assert sentence_bleu(hyp, [ref], max_n=4) == pytest.approx((1 / 240) ** 0.25)
    # brevity: c = 2, closest r = 4 -> BP = exp(1 - 4/2) = e^-1; p1 = p2 = 1, orders 3-4 absent
    assert sentence_bleu(["the", "cat"], [tokenize("the cat sat on")]) == pytest.approx(math.exp(-1))
    # closest length: refs of length 5 and 8 for c = 6 -> r = 5 < c, so no penalty
    assert sentence_bleu(hyp, [hyp[:5], hyp + ["x", "y"]]) == pytest.approx(1.0)
    assert sentence_bleu([], [ref]) == 0.0
    # clipping: "the the the" vs "the cat" -> p1 = 1/3 (one "the" usable); p2 = 0 of 2 -> 0.1/2
    assert sentence_bleu(["the"] * 3, [["the", "cat"]], max_n=2) == pytest.approx(math.sqrt(1 / 3 * 0.05))


def test_self_bleu_identical_and_disjoint():
    same = self_bleu([["the answer is 42 .", "the answer is 42 .", "the answer is 42 ."], ["ok", "ok"]])
    np.testing.assert_allclose(same["values_P"], [1.0, 1.0])
    words = [[f"w{i}_{j}" for j in range(10)] for i in range(3)]
    disjoint = self_bleu([[" ".join(w) for w in words]])
    # no matches at any order: p_n = 0.1 / (10, 9, 8, 7), BP = 1 -> 0.1 / 5040 ** 0.25 ~ 0.012
    assert disjoint["values_P"][0] == pytest.approx(0.1 / 5040**0.25)
    assert disjoint["mean"] < 0.02
    assert math.isnan(self_bleu([["only one"]])["values_P"][0])
    assert math.isnan(self_bleu([["", " "]])["values_P"][0])
    # the empty sample is skipped as a hypothesis: only "a b" vs refs {"", "a b"} -> 1
    assert self_bleu([["a b", "", "a b"]])["values_P"][0] == 1.0


def test_self_bleu_equals_mean_sentence_bleu_against_the_others():
    gen = np.random.default_rng(4)
    vocab = ["a", "b", "c", "d", "e", "."]
    texts = [" ".join(gen.choice(vocab, size=int(gen.integers(1, 12)))) for _ in range(7)]
    texts += [texts[0]]  # a duplicate, so some n-gram counts tie for the maximum
    tokens = [tokenize(t) for t in texts]
    expected = np.mean([sentence_bleu(tokens[i], tokens[:i] + tokens[i + 1 :]) for i in range(len(tokens))])
    assert self_bleu([texts])["values_P"][0] == pytest.approx(expected, abs=1e-12)


def test_self_bleu_subsampling_is_seeded():
    texts = [[f"sample {i} says {i % 3}" for i in range(40)]]
    with pytest.raises(ValueError):
        self_bleu(texts, max_samples=8)  # subsampling needs an explicit rng
    a = self_bleu(texts, rng=np.random.default_rng(5), max_samples=8)
    b = self_bleu(texts, rng=np.random.default_rng(5), max_samples=8)
    assert a["mean"] == b["mean"]
    assert 0.0 <= a["mean"] <= 1.0


def test_distinct_correct_solutions():
    keys = [["s1", "s1", "s2", None], ["s1", "s2", "s3", "s4"], ["x"]]
    correct = [[True, True, True, True], [False, True, False, True], [False]]
    # {s1, s2} = 2 (None ignored); {s2, s4} = 2; no correct sample = 0
    result = distinct_correct_solutions(keys, correct)
    np.testing.assert_array_equal(result["counts_P"], [2, 2, 0])
    assert result["mean"] == pytest.approx(4 / 3)


def test_diversity_report_views():
    texts = [["a b", "a c", "d"], ["x y", "x y"]]
    answer_keys = [["1", "2", None], ["5", "5"]]
    solution_keys = [["s", "t", None], ["u", "u"]]
    correct = [[True, True, False], [False, False]]
    report = diversity_report(texts, answer_keys, solution_keys, correct, np.random.default_rng(0))
    assert report["all"]["num_problems"] == 2
    # all: distinct answers (2 + 1) / 2; correct view only has problem 1, with answers {1, 2}
    assert report["all"]["distinct_answers"] == pytest.approx(1.5)
    assert report["correct"]["num_problems"] == 1
    assert report["correct"]["distinct_answers"] == 2
    # correct view entropy: two answers once each -> ln 2
    assert report["correct"]["answer_entropy"] == pytest.approx(math.log(2))
    # correct-view distinct-1: a b a c -> 3/4
    assert report["correct"]["distinct_1"] == pytest.approx(0.75)
    assert report["distinct_correct_solutions"] == pytest.approx(1.0)  # (2 + 0) / 2
    assert set(report["all"]) == set(report["correct"])
    with pytest.raises(ValueError):
        diversity_report(texts, answer_keys, solution_keys, [[True], [False, False]], np.random.default_rng(0))
