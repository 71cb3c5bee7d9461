"""Diversity of a model's samples per problem: final answers, surface n-grams, and solutions.

Per-problem values are float arrays with NaN where a problem has nothing to measure (e.g. no
samples, or no correct samples in the correct-only view); every ``mean`` skips those NaNs.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from es_llm.metrics.passk import as_bool_rows


def tokenize(text: str) -> list[str]:
    """Split text into word runs and single punctuation marks, the regex ``\\w+|[^\\w\\s]``.

    No lowercasing or normalisation: two samples differing only in case count as different
    surface forms, which is what a surface-diversity metric should see.
    """
    return re.findall(r"\w+|[^\w\s]", text)


def _ngrams(tokens: Sequence[str], order: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + order]) for i in range(len(tokens) - order + 1)]


def _nanmean(values_P: np.ndarray) -> float:
    """Mean over the finite entries; NaN when there are none (without numpy's warning)."""
    finite = values_P[np.isfinite(values_P)]
    return float(finite.mean()) if finite.size else float("nan")


def distinct_answers(answer_keys: Sequence[Sequence[str | None]]) -> dict:
    """Number of distinct final answers per problem.

    Args:
        answer_keys: list over problems of per-sample answer keys (``str``, or None for no
            parseable answer).

    Returns:
        ``{"counts_P": float array, "mean": float}``: distinct non-None keys per problem (None is
        not an answer, so it never adds to the count); NaN for a problem with no samples.
    """
    counts_P = np.array(
        [len({key for key in keys if key is not None}) if len(keys) else np.nan for keys in answer_keys],
        dtype=np.float64,
    )
    return {"counts_P": counts_P, "mean": _nanmean(counts_P)}


def answer_entropy(answer_keys: Sequence[Sequence[str | None]]) -> dict:
    """Shannon entropy (nats) of the empirical final-answer distribution per problem.

    Args:
        answer_keys: list over problems of per-sample answer keys (``str`` or None).

    Returns:
        A dict of float arrays and their means: ``entropy_P`` / ``mean_entropy``,
        ``exp_entropy_P`` / ``mean_exp_entropy`` (the effective number of answers), and
        ``plurality_share_P`` / ``mean_plurality_share`` (count of the most common non-None key
        over all samples, i.e. the vote share a majority vote would elect; 0 if no sample has an
        answer). NaN for problems with no samples.

    None is counted as one extra outcome ("no answer") in the entropy rather than dropped:
    dropping it would call a problem with one parsed answer and 99 failures perfectly
    concentrated, and a model that often fails to answer would look less diverse than it is.
    Reference: Shannon 1948; exp(H) as the "effective number" (Hill 1973).
    """
    entropy, exp_entropy, plurality = [], [], []
    for keys in answer_keys:
        total = len(keys)
        if total == 0:
            entropy.append(np.nan)
            exp_entropy.append(np.nan)
            plurality.append(np.nan)
            continue
        # Keys are wrapped so a literal answer string can never collide with the None outcome.
        counts = Counter((key is None, key) for key in keys)
        probs = np.array(list(counts.values()), dtype=np.float64) / total
        h = float(-np.sum(probs * np.log(probs)))
        entropy.append(h)
        exp_entropy.append(math.exp(h))
        answered = [count for (is_none, _), count in counts.items() if not is_none]
        plurality.append(max(answered) / total if answered else 0.0)
    out = {
        "entropy_P": np.array(entropy, dtype=np.float64),
        "exp_entropy_P": np.array(exp_entropy, dtype=np.float64),
        "plurality_share_P": np.array(plurality, dtype=np.float64),
    }
    out["mean_entropy"] = _nanmean(out["entropy_P"])
    out["mean_exp_entropy"] = _nanmean(out["exp_entropy_P"])
    out["mean_plurality_share"] = _nanmean(out["plurality_share_P"])
    return out


def distinct_n(texts: Sequence[Sequence[str]], n: int) -> dict:
    """distinct-n per problem: unique n-grams / total n-grams, pooled over the problem's samples.

    Args:
        texts: list over problems of per-sample completions.
        n: n-gram order, >= 1.

    Returns:
        ``{"values_P": float array, "mean": float}``; NaN for a problem whose samples hold no
        n-gram at all (skipped in the mean).

    Reference: Li et al. 2016, "A Diversity-Promoting Objective Function for Neural
    Conversation Models". N-grams never span two samples; tokens come from ``tokenize``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    values = []
    for samples in texts:
        pooled = [gram for text in samples for gram in _ngrams(tokenize(text), n)]
        values.append(len(set(pooled)) / len(pooled) if pooled else np.nan)
    values_P = np.array(values, dtype=np.float64)
    return {"values_P": values_P, "mean": _nanmean(values_P)}


def _closest_length(hyp_len: int, ref_lens: Sequence[int]) -> int:
    # Ties go to the shorter reference, as in Papineni et al.'s reference implementation.
    return min(ref_lens, key=lambda r: (abs(r - hyp_len), r))


def _bleu_from_stats(matches: Sequence[int], totals: Sequence[int], hyp_len: int, ref_len: int, epsilon: float) -> float:
    """BLEU from per-order clipped matches and hypothesis n-gram totals."""
    if hyp_len == 0:
        return 0.0
    # Effective order: orders for which the hypothesis has no n-gram carry no evidence, so they
    # are left out of the geometric mean instead of being floored (a 2-token sample would
    # otherwise be capped far below 1 even when it equals its reference).
    logs = [math.log(max(m, epsilon) / t) for m, t in zip(matches, totals) if t > 0]
    brevity = 1.0 if hyp_len > ref_len else math.exp(1.0 - ref_len / hyp_len)
    return brevity * math.exp(sum(logs) / len(logs))


def sentence_bleu(
    hypothesis: Sequence[str],
    references: Sequence[Sequence[str]],
    max_n: int = 4,
    epsilon: float = 0.1,
) -> float:
    """Sentence-level BLEU of one tokenised hypothesis against tokenised references, in [0, 1].

    Args:
        hypothesis: tokens of the hypothesis.
        references: one or more token lists.
        max_n: highest n-gram order; orders are weighted uniformly.
        epsilon: numerator used for an order with zero clipped matches.

    Returns:
        BP * exp(mean_n log p_n), p_n = clipped matches / hypothesis n-grams, each n-gram count
        clipped to its largest count in any single reference; BP = exp(1 - r/c) when c <= r, with
        r the reference length closest to c. An empty hypothesis scores 0.

    Reference: Papineni et al. 2002 (BLEU). Departures for short single sentences: a zero match
    count is replaced by ``epsilon`` (smoothing "method 1" of Chen & Cherry 2014), and orders
    longer than the hypothesis are dropped from the mean (their "effective order").

    Raises:
        ValueError: no references or max_n < 1.
    """
    if not references:
        raise ValueError("sentence_bleu needs at least one reference")
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    matches, totals = [], []
    for order in range(1, max_n + 1):
        hyp_counts = Counter(_ngrams(hypothesis, order))
        ref_max: Counter = Counter()
        for ref in references:
            ref_max |= Counter(_ngrams(ref, order))
        matches.append(sum(min(count, ref_max[gram]) for gram, count in hyp_counts.items()))
        totals.append(sum(hyp_counts.values()))
    ref_len = _closest_length(len(hypothesis), [len(ref) for ref in references])
    return _bleu_from_stats(matches, totals, len(hypothesis), ref_len, epsilon)


def _leave_one_out_matches(counters: list[Counter]) -> list[int]:
    """Clipped matches of each sample against the max counts over all OTHER samples.

    For every n-gram the largest count, its owner and the largest count among the rest are
    kept, so "max over j != i" is one lookup and a problem costs O(total n-grams), not O(m^2).
    """
    table: dict[tuple[str, ...], list[int]] = {}
    for i, counts in enumerate(counters):
        for gram, count in counts.items():
            entry = table.get(gram)
            if entry is None:
                table[gram] = [count, i, 0]
            elif count > entry[0]:
                entry[2], entry[0], entry[1] = entry[0], count, i
            elif count > entry[2]:
                entry[2] = count
    matches = []
    for i, counts in enumerate(counters):
        total = 0
        for gram, count in counts.items():
            best, owner, second = table[gram]
            total += min(count, second if owner == i else best)
        matches.append(total)
    return matches


def _self_bleu_one(token_lists: list[list[str]], max_n: int, epsilon: float) -> float:
    m = len(token_lists)
    if m < 2:
        return float("nan")
    matches_O_m, totals_O_m = [], []
    for order in range(1, max_n + 1):
        counters = [Counter(_ngrams(tokens, order)) for tokens in token_lists]
        matches_O_m.append(_leave_one_out_matches(counters))
        totals_O_m.append([sum(c.values()) for c in counters])
    lengths = [len(tokens) for tokens in token_lists]
    scores = []
    for i in range(m):
        if lengths[i] == 0:
            # An empty completion is a failure to write, not a diverse one; it still serves
            # as a (length-0) reference for the others.
            continue
        ref_len = _closest_length(lengths[i], lengths[:i] + lengths[i + 1 :])
        matches = [row[i] for row in matches_O_m]
        totals = [row[i] for row in totals_O_m]
        scores.append(_bleu_from_stats(matches, totals, lengths[i], ref_len, epsilon))
    return float(np.mean(scores)) if scores else float("nan")


def self_bleu(
    texts: Sequence[Sequence[str]],
    max_n: int = 4,
    rng: np.random.Generator | None = None,
    max_samples: int = 32,
    epsilon: float = 0.1,
) -> dict:
    """Self-BLEU per problem: mean BLEU of each sample against all other samples of the problem.

    Args:
        texts: list over problems of per-sample completions.
        max_n: highest n-gram order of ``sentence_bleu``.
        rng: seeded generator; needed only when some problem has more than ``max_samples``
            samples, which are then subsampled without replacement.
        max_samples: cap on samples per problem. BLEU clips against the max count over the
            references, so it rises with the number of references; a fixed cap keeps runs with
            different n comparable as well as bounding the cost.
        epsilon: zero-match numerator, see ``sentence_bleu``.

    Returns:
        ``{"values_P": float array in [0, 1], "mean": float}``; higher = more alike (less
        diverse). Empty completions are not scored as hypotheses (they would count as maximally
        diverse) but stay among the references; NaN for problems with fewer than 2 samples or
        no non-empty one.

    Reference: Zhu et al. 2018, "Texygen". Uses ``sentence_bleu`` on ``tokenize`` tokens.

    Raises:
        ValueError: subsampling is needed but ``rng`` is None, or max_samples < 2.
    """
    if max_samples < 2:
        raise ValueError(f"max_samples must be >= 2, got {max_samples}")
    values = []
    for p, samples in enumerate(texts):
        samples = list(samples)
        if len(samples) > max_samples:
            if rng is None:
                raise ValueError(f"problem {p} has {len(samples)} > max_samples samples; pass rng")
            keep = np.sort(rng.choice(len(samples), size=max_samples, replace=False))
            samples = [samples[i] for i in keep]
        values.append(_self_bleu_one([tokenize(t) for t in samples], max_n, epsilon))
    values_P = np.array(values, dtype=np.float64)
    return {"values_P": values_P, "mean": _nanmean(values_P)}


def distinct_correct_solutions(solution_keys: Sequence[Sequence[str | None]], correct) -> dict:
    """Number of distinct solutions among the correct samples of each problem.

    Args:
        solution_keys: list over problems of per-sample canonical solution keys (``str`` or
            None when no canonical form could be extracted; None is not counted).
        correct: list over problems of 1-D bool sequences, same lengths, or P x N bools.

    Returns:
        ``{"counts_P": float array, "mean": float}``; a problem with no correct sample counts 0.

    Raises:
        ValueError: mismatched lengths.
    """
    rows = as_bool_rows(correct)
    if len(solution_keys) != len(rows):
        raise ValueError(f"solution_keys has {len(solution_keys)} problems, correct has {len(rows)}")
    counts = []
    for p, (keys, correct_N) in enumerate(zip(solution_keys, rows)):
        if len(keys) != correct_N.size:
            raise ValueError(f"problem {p}: {len(keys)} solution keys but {correct_N.size} samples")
        counts.append(len({key for key, ok in zip(keys, correct_N) if ok and key is not None}))
    counts_P = np.array(counts, dtype=np.float64)
    return {"counts_P": counts_P, "mean": _nanmean(counts_P)}


def _view_metrics(texts, answer_keys, rng: np.random.Generator, max_samples: int) -> dict:
    entropy = answer_entropy(answer_keys)
    return {
        "num_problems": int(sum(1 for keys in answer_keys if len(keys))),
        "distinct_answers": distinct_answers(answer_keys)["mean"],
        "answer_entropy": entropy["mean_entropy"],
        "exp_answer_entropy": entropy["mean_exp_entropy"],
        "plurality_share": entropy["mean_plurality_share"],
        "distinct_1": distinct_n(texts, 1)["mean"],
        "distinct_2": distinct_n(texts, 2)["mean"],
        "distinct_3": distinct_n(texts, 3)["mean"],
        "self_bleu": self_bleu(texts, rng=rng, max_samples=max_samples)["mean"],
    }


def diversity_report(
    texts: Sequence[Sequence[str]],
    answer_keys: Sequence[Sequence[str | None]],
    solution_keys: Sequence[Sequence[str | None]],
    correct,
    rng: np.random.Generator,
    max_samples: int = 32,
) -> dict:
    """Headline diversity numbers over all samples and over correct samples only.

    Args:
        texts: list over problems of per-sample completions (lengths n_i).
        answer_keys: list over problems of per-sample answer keys, same lengths.
        solution_keys: list over problems of per-sample solution keys, same lengths.
        correct: list over problems of 1-D bool sequences, same lengths, or P x N bools.
        rng: seeded generator for the self-BLEU subsample.
        max_samples: self-BLEU sample cap per problem.

    Returns:
        ``{"all": {...}, "correct": {...}, "distinct_correct_solutions": float}``; each view has
        ``num_problems`` (problems with at least one sample in the view) and the means over those
        problems of ``distinct_answers``, ``answer_entropy``, ``exp_answer_entropy``,
        ``plurality_share``, ``distinct_1``/``_2``/``_3`` and ``self_bleu``. In the correct view,
        problems without a correct sample are left out of the means rather than scored as zero
        diversity, so it describes how varied the successes are where there are any. Means with
        no contributing problem are NaN.

    Raises:
        ValueError: mismatched lengths.
    """
    rows = as_bool_rows(correct)
    if not len(texts) == len(answer_keys) == len(solution_keys) == len(rows):
        raise ValueError("texts, answer_keys, solution_keys and correct must list the same problems")
    for p, (t, a, s, c) in enumerate(zip(texts, answer_keys, solution_keys, rows)):
        if not len(t) == len(a) == len(s) == c.size:
            raise ValueError(f"problem {p}: texts, answer_keys, solution_keys, correct differ in length")
    texts_ok = [[t for t, ok in zip(ts, c) if ok] for ts, c in zip(texts, rows)]
    keys_ok = [[a for a, ok in zip(ks, c) if ok] for ks, c in zip(answer_keys, rows)]
    return {
        "all": _view_metrics(texts, answer_keys, rng, max_samples),
        "correct": _view_metrics(texts_ok, keys_ok, rng, max_samples),
        "distinct_correct_solutions": distinct_correct_solutions(solution_keys, rows)["mean"],
    }
