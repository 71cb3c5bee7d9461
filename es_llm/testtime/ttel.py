"""TTEL: localise the erroneous step of a failed trajectory, truncate there, branch.

No paper named TTEL was available; this follows the reading of metrics.md 5.1 with the
project's choice of signal. For a failed ``solve`` trajectory y, every token of y is scored
twice by teacher forcing: under a feedback context (the ``revise`` prompt that shows y with
the verifier's message ``wrong``) and under the null context (the plain ``solve`` prompt).
The revise role learned to copy a trace's valid prefix and to depart from it where it went
wrong, so the tokens whose log-probability the feedback lowers most mark the error:
``gap_t = log p(y_t | null) - log p(y_t | feedback)``. The trajectory's segments are its
written steps and its answer; the segment holding the largest token gap is the error. The
trajectory is cut before it and ``B`` continuations are sampled from the kept prefix under
the solve prompt. Cost: the trajectory's tokens, the branches' tokens, and the 2|y| tokens
the two scoring passes read.
"""

from __future__ import annotations

import re

import numpy as np

from es_llm.tasks import Problem
from es_llm.tasks.countdown_roles import NO_LOCATION, first_wrong_step
from es_llm.testtime.methods import MethodInput, MethodResult, outcome, prompt, register_method


def segments(text: str) -> list[tuple[int, int]]:
    """Character spans of a trajectory's steps (the words before ``<answer>``) and of its
    answer (from ``<answer>`` to the end), left to right."""
    cut = text.find("<answer>")
    body_end = len(text) if cut < 0 else cut
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text[:body_end])]
    if cut >= 0:
        spans.append((cut, len(text)))
    return spans


def error_segment(spans: list[tuple[int, int]], gap_T: np.ndarray,
                  offsets_T: list[int]) -> int:
    """The index of the span holding the largest token gap (``offsets_T[t]``: the character
    where token t starts; a token counts for the span it starts in). Spans without a token
    never win; ties go to the earliest span."""
    best, where = -np.inf, 0
    for s, (lo, hi) in enumerate(spans):
        inside = [g for g, o in zip(gap_T, offsets_T) if lo <= o < hi]
        if inside and max(inside) > best:
            best, where = max(inside), s
    return where


def token_offsets(tokenizer, text: str) -> list[int]:
    """Where each token of ``text`` (encoded without special tokens) starts."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    offsets, pos = [], 0
    for i in ids:
        offsets.append(pos)
        pos += len(tokenizer.decode([i]))
    return offsets


def localize(gen, label, problems: list[Problem], texts: list[str]) -> list[int]:
    """The error segment of each failed trajectory (``texts[i]`` of ``problems[i]``)."""
    feedback = [(p, prompt(p, "revise", trace=t, critique=NO_LOCATION), t)
                for p, t in zip(problems, texts)]
    null = [(p, prompt(p, "solve"), t) for p, t in zip(problems, texts)]
    lp_fb = gen.score_tokens(label, feedback)
    lp_null = gen.score_tokens(label, null)
    tokenizer = gen.scorer.tokenizer
    return [error_segment(segments(t), np.array(n) - np.array(f), token_offsets(tokenizer, t))
            for t, f, n in zip(texts, lp_fb, lp_null)]


@register_method("ttel", roles=("solve", "revise"), needs_scorer=True, unit="branches")
def ttel(inp: MethodInput) -> MethodResult:
    """One trajectory per problem; for a failed one, localise, cut and branch ``budget``
    continuations from the valid prefix."""
    first = inp.gen.draw(inp.label, "trajectory",
                         [(p, prompt(p, "solve")) for p in inp.problems], 1, inp.cfg.max_tokens)
    failed = [(p, g[0]) for p, g in zip(inp.problems, first) if not g[0].correct]
    where = localize(inp.gen, inp.label, [p for p, _ in failed], [g.text for _, g in failed])
    prefixes = [g.text[:segments(g.text)[w][0]] if segments(g.text) else ""
                for (_, g), w in zip(failed, where)]
    branches = inp.gen.draw(inp.label, "branch",
                            [(p, prompt(p, "solve") + head) for (p, _), head in
                             zip(failed, prefixes)],
                            inp.budget, inp.cfg.max_tokens, prefixes=prefixes)
    fixed = {p.id: (w, b, g) for (p, g), w, b in zip(failed, where, branches)}
    rows, hits, chance = [], [], []
    for p, g in zip(inp.problems, first):
        if p.id not in fixed:
            rows.append(outcome(p, g, g[0], failed=False))
            continue
        w, b, traj = fixed[p.id]
        label = first_wrong_step(p.gold["numbers"], p.gold["target"], traj.text)
        n_segments = max(len(segments(traj.text)), 1)
        hits.append(label is not None and w + 1 == label)
        chance.append(1 / n_segments)
        rows.append(outcome(p, g + b, next((x for x in b if x.correct), b[0]), failed=True,
                            error_segment=w + 1, verifier_step=label))
    return MethodResult(rows, {
        "failed_trajectories": len(failed),
        "localization_matches_verifier": float(np.mean(hits)) if hits else None,
        "chance_of_a_random_segment": float(np.mean(chance)) if chance else None,
        "recovered_by_branching": (float(np.mean([r["covered"] for r in rows if r["failed"]]))
                                   if failed else None)})
