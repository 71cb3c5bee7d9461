"""Capability or sharpening: the same models read greedily and sampled, on several problem sets.

A gain in sampled pass@1 can be new problems solved, or probability mass moved onto answers
the model already gave greedily (sharpening). The two read differently side by side: per
problem set and method, greedy accuracy (one sample at T = 0), sampled pass@1 and pass@n at
each temperature, the answer entropy, and the sharpening gap, greedy accuracy minus sampled
pass@1 at the same temperature (how much sampling loses against the model's own first
choice; it shrinks when training only sharpens). Against the reference, the problems each
method newly solves greedily and the ones it loses.

A method's values are means over its training seeds. "Newly solved" counts, per seed, the
problems the reference gets wrong greedily and the seed gets right; with a reference of
several seeds, a problem counts as wrong (right) for it when every one of its seeds is wrong
(right).
"""

from __future__ import annotations

import numpy as np

from es_llm.compare.analysis import Resamples, paired, passk_table, shared_resamples
from es_llm.compare.samples import SampleSet
from es_llm.metrics import answer_entropy


def view_label(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"T={temperature:g}"


def _by_method(sets: list[SampleSet]) -> dict[str, list[SampleSet]]:
    out: dict[str, list[SampleSet]] = {}
    for s in sets:
        out.setdefault(s.method, []).append(s)
    return out


def _sampled(sets: list[SampleSet]) -> dict:
    """pass@1, pass@n and the mean answer entropy of one method's seeds (seed means)."""
    n = sets[0].n
    tables = [passk_table(s.correct, [1, n]).mean(axis=0) for s in sets]
    entropy = [float(np.nanmean(answer_entropy(s.answer_keys)["entropy_P"])) for s in sets]
    return {"n": n, "pass@1": float(np.mean([t[0] for t in tables])),
            "pass@n": float(np.mean([t[1] for t in tables])),
            "entropy": float(np.mean(entropy))}


def _greedy_vs(reference: list[SampleSet], method: list[SampleSet],
               resamples: Resamples) -> dict:
    """Greedy accuracy of ``method`` against ``reference``: the paired difference of the
    seed-mean correctness per problem, and the problems newly solved and lost (seed means)."""
    ref_P = np.mean([np.array([c[0] for c in s.correct], float) for s in reference], axis=0)
    per_seed = [np.array([c[0] for c in s.correct], float) for s in method]
    gained = [int(np.sum((ref_P == 0) & (m_P == 1))) for m_P in per_seed]
    lost = [int(np.sum((ref_P == 1) & (m_P == 0))) for m_P in per_seed]
    return {"greedy": paired(np.mean(per_seed, axis=0), ref_P, resamples),
            "newly_solved": float(np.mean(gained)), "lost": float(np.mean(lost)),
            "seed_values": {s.name: {"newly_solved": g, "lost": l}
                            for s, g, l in zip(method, gained, lost)}}


def capability(views: list[dict], reference: str, rng: np.random.Generator,
               num_resamples: int = 1000) -> dict:
    """The capability table of a comparison as a JSON-ready dict.

    Args:
        views: one per (problem set, temperature): ``{"data": label, "temperature": T,
            "sets": [SampleSet, ...]}``, the sets aligned (``samples.align``); T = 0 is the
            greedy view (one sample per problem).
        reference: the method (or model) the others are measured against.
    Returns: ``{"reference", "temperatures", "sets": [{"data", "num_problems", "methods":
        {method: {"greedy", "sampled": {label: {...}}, "gap": {label: greedy - pass@1}}},
        "vs_reference": {method: {...}}}]}``; ``greedy`` and ``gap`` are None for a set
        without a greedy view.
    """
    temperatures = sorted({v["temperature"] for v in views if v["temperature"] > 0})
    out_sets = []
    for data in dict.fromkeys(v["data"] for v in views):
        mine = {v["temperature"]: _by_method(v["sets"]) for v in views if v["data"] == data}
        first = next(iter(mine.values()))
        ref = reference.split("@")[0]
        methods = {}
        for method in first:
            greedy = (float(np.mean([np.mean([c[0] for c in s.correct]) for s in mine[0][method]]))
                      if 0 in mine else None)
            sampled = {view_label(t): _sampled(mine[t][method]) for t in temperatures if t in mine}
            methods[method] = {
                "greedy": greedy, "sampled": sampled,
                "gap": {label: None if greedy is None else greedy - s["pass@1"]
                        for label, s in sampled.items()}}
        entry = {"data": data, "num_problems": len(first[ref][0].problem_ids),
                 "methods": methods, "vs_reference": {}}
        if 0 in mine:
            resamples = shared_resamples(len(first[ref][0].problem_ids), rng, num_resamples)
            entry["vs_reference"] = {m: _greedy_vs(mine[0][ref], mine[0][m], resamples)
                                     for m in mine[0] if m != ref}
        out_sets.append(entry)
    return {"reference": reference, "temperatures": [view_label(t) for t in temperatures],
            "sets": out_sets}
