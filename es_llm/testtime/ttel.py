"""TTEL: localise the erroneous step of a failed trajectory, truncate there, branch.

No paper named TTEL was available; this follows the reading of metrics.md 5.1 and the
source's claim that feedback, set against a null-context baseline of the same context,
localises the error. For a failed ``solve`` trajectory y, every token of y is scored twice
by teacher forcing, under two contexts that differ in one line only: the ``revise`` prompt
that shows y with the verifier's message ``wrong`` (the feedback), and the same prompt with
the same trace and the no-information critique ``check`` (the null). Every token of y is
copyable in both, so the copy effect cancels and what is left is what the feedback says:
``gap_t = log p(y_t | null) - log p(y_t | feedback)``. A segment's gap is the largest gap of
the tokens starting in it; the segments are the trajectory's written steps and its answer.
The error is the earliest segment whose gap reaches ``ttel_threshold`` (nats), or, with the
threshold off or no segment reaching it, the segment of the largest gap.

The trajectory is cut before the error and branched from the kept prefix under the solve
prompt, by one of the ``BRANCHINGS``: ``parallel`` (localise once, every branch from the
one prefix) or ``sequential`` (one branch at a time; a branch the verifier rejects is the
next trajectory, localised afresh, as the source reads). The committed answer is the vote
of the branches (``answered``, comparable with the other methods' votes); the first branch
the verifier accepts is reported beside it (``answered_by_checker``). Cost: the
trajectory's tokens, the branches' tokens, and the 2|y| tokens each localisation reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from es_llm.tasks import Problem
from es_llm.tasks.countdown_roles import NO_LOCATION, SELF_REPAIR, first_wrong_step
from es_llm.testtime.generations import Gen
from es_llm.testtime.methods import (BRANCHINGS, MethodInput, MethodResult, mean_or_none,
                                     outcome, prompt, register_method, vote)


def contexts(problem: Problem, trace: str) -> tuple[str, str]:
    """(feedback, null) contexts of a failed trajectory: one revise prompt with the same
    trace, the critique line ``wrong`` in the first and ``check`` in the second."""
    return (prompt(problem, "revise", trace=trace, critique=NO_LOCATION),
            prompt(problem, "revise", trace=trace, critique=SELF_REPAIR))


def segments(text: str) -> list[tuple[int, int]]:
    """Character spans of a trajectory's steps (the words before ``<answer>``) and of its
    answer (from ``<answer>`` to the end), left to right."""
    cut = text.find("<answer>")
    body_end = len(text) if cut < 0 else cut
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text[:body_end])]
    if cut >= 0:
        spans.append((cut, len(text)))
    return spans


def segment_gaps(spans: list[tuple[int, int]], gap_T: np.ndarray,
                 offsets_T: list[int]) -> list[float | None]:
    """Each span's largest token gap (``offsets_T[t]``: the character where token t starts;
    a token counts for the span it starts in); None for a span without a token."""
    out = []
    for lo, hi in spans:
        inside = [g for g, o in zip(gap_T, offsets_T) if lo <= o < hi]
        out.append(float(max(inside)) if inside else None)
    return out


def pick_segment(gaps: list[float | None], threshold: float = 0.0) -> int:
    """The error segment: with ``threshold > 0`` the earliest whose gap reaches it; else,
    or when none does, the largest gap (ties to the earliest). Spans without a token never
    win; 0 when no span has one."""
    scored = [(s, g) for s, g in enumerate(gaps) if g is not None]
    if threshold > 0:
        passing = [s for s, g in scored if g >= threshold]
        if passing:
            return passing[0]
    return max(scored, key=lambda sg: (sg[1], -sg[0]))[0] if scored else 0


def error_segment(spans: list[tuple[int, int]], gap_T: np.ndarray, offsets_T: list[int],
                  threshold: float = 0.0) -> int:
    """The index of the error span of one trajectory (``pick_segment`` of its gaps)."""
    return pick_segment(segment_gaps(spans, gap_T, offsets_T), threshold)


def token_offsets(tokenizer, text: str) -> list[int]:
    """Where each token of ``text`` (encoded without special tokens) starts."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    offsets, pos = [], 0
    for i in ids:
        offsets.append(pos)
        pos += len(tokenizer.decode([i]))
    return offsets


def localize(gen, label, problems: list[Problem], texts: list[str],
             threshold: float = 0.0) -> list[int]:
    """The error segment of each failed trajectory (``texts[i]`` of ``problems[i]``)."""
    pairs = [contexts(p, t) for p, t in zip(problems, texts)]
    lp_fb = gen.score_tokens(label, [(p, fb, t) for p, (fb, _), t in zip(problems, pairs, texts)])
    lp_null = gen.score_tokens(label, [(p, nl, t) for p, (_, nl), t in zip(problems, pairs, texts)])
    tokenizer = gen.scorer.tokenizer
    return [error_segment(segments(t), np.array(n) - np.array(f), token_offsets(tokenizer, t),
                          threshold)
            for t, f, n in zip(texts, lp_fb, lp_null)]


def kept_prefix(text: str, where: int) -> str:
    """The trajectory up to the start of segment ``where`` (empty without segments)."""
    spans = segments(text)
    return text[:spans[where][0]] if spans else ""


# ---------------------------------------------------------------------------------------------
# Branching variants
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BranchInput:
    """What a branching variant gets: the method's input (its budget is the branches per
    failed trajectory) and the failed first trajectories."""

    method: MethodInput
    failed: list[tuple[Problem, Gen]]


@dataclass(frozen=True)
class Branched:
    """One failed trajectory's branching: the segment its first localisation picked
    (0-based), the branches in the order drawn, and how many localisations it took."""

    first_segment: int
    branches: list[Gen]
    localizations: int


def _cut_and_branch(m: MethodInput, stage: str, todo: list[tuple[Problem, str]], n: int
                    ) -> tuple[list[int], list[list[Gen]]]:
    """Localise each ``(problem, trajectory)``, cut before the error and draw ``n``
    continuations of the kept prefix: (segments, branches)."""
    where = localize(m.gen, m.label, [p for p, _ in todo], [t for _, t in todo],
                     m.cfg.ttel_threshold)
    heads = [kept_prefix(t, w) for (_, t), w in zip(todo, where)]
    outs = m.gen.draw(m.label, stage, [(p, prompt(p, "solve") + h)
                                       for (p, _), h in zip(todo, heads)],
                      n, m.cfg.max_tokens, prefixes=heads)
    return where, outs


@BRANCHINGS.register("parallel")
def parallel(b: BranchInput) -> list[Branched]:
    """Localise once; every branch continues the one kept prefix."""
    where, outs = _cut_and_branch(b.method, "branch", [(p, g.text) for p, g in b.failed],
                                  b.method.budget)
    return [Branched(w, o, 1) for w, o in zip(where, outs)]


@BRANCHINGS.register("sequential")
def sequential(b: BranchInput) -> list[Branched]:
    """One branch per round, up to the budget: a rejected branch is the trajectory the next
    round localises and cuts. Problems run in lockstep, one batch per round; each round is
    a stage of its own so its samples draw fresh random streams."""
    current = {p.id: g.text for p, g in b.failed}
    first: dict[str, int] = {}
    drawn: dict[str, list[Gen]] = {p.id: [] for p, _ in b.failed}
    active = [p for p, _ in b.failed]
    for r in range(b.method.budget):
        if not active:
            break
        where, outs = _cut_and_branch(b.method, f"branch-{r + 1}",
                                      [(p, current[p.id]) for p in active], 1)
        for p, w, (g,) in zip(active, where, outs):
            first.setdefault(p.id, w)
            drawn[p.id].append(g)
            current[p.id] = g.text
        active = [p for p, (g,) in zip(active, outs) if not g.correct]
    return [Branched(first[p.id], drawn[p.id], len(drawn[p.id])) for p, _ in b.failed]


# ---------------------------------------------------------------------------------------------
# The method
# ---------------------------------------------------------------------------------------------

def _failed_row(p: Problem, first: Gen, br: Branched) -> dict:
    """The outcome of a failed trajectory: committed to the vote of its branches, with the
    checker's pick (the first branch the verifier accepts) beside it."""
    picked = next((x for x in br.branches if x.correct), br.branches[0])
    label = first_wrong_step(p.gold["numbers"], p.gold["target"], first.text)
    return outcome(p, [first, *br.branches], vote(br.branches), failed=True,
                   answered_by_checker=picked.correct, error_segment=br.first_segment + 1,
                   verifier_step=label, localizations=br.localizations,
                   segments=max(len(segments(first.text)), 1))


def ttel_stats(rows: list[dict]) -> dict:
    """Localisation against the verifier's first wrong step (a random segment's chance
    beside it), recovery of the failures, and the two committed-answer rates."""
    failed = [r for r in rows if r["failed"]]
    return {
        "failed_trajectories": len(failed),
        "localization_matches_verifier": mean_or_none([r["verifier_step"] is not None
                                               and r["error_segment"] == r["verifier_step"]
                                               for r in failed]),
        "chance_of_a_random_segment": mean_or_none([1 / r["segments"] for r in failed]),
        "localizations_per_failure": mean_or_none([r["localizations"] for r in failed]),
        "recovered_by_branching": mean_or_none([r["covered"] for r in failed]),
        "answered_by_vote": mean_or_none([r["answered"] for r in rows]),
        "answered_by_checker": mean_or_none([r["answered_by_checker"] for r in rows])}


@register_method("ttel", roles=("solve", "revise"), needs_scorer=True, unit="branches")
def ttel(inp: MethodInput) -> MethodResult:
    """One trajectory per problem; a failed one is localised, cut and branched ``budget``
    times by the configured branching variant."""
    first = inp.gen.draw(inp.label, "trajectory",
                         [(p, prompt(p, "solve")) for p in inp.problems], 1, inp.cfg.max_tokens)
    failed = [(p, g[0]) for p, g in zip(inp.problems, first) if not g[0].correct]
    branch = BRANCHINGS.get(inp.cfg.ttel_branching)
    branched = {p.id: br for (p, _), br in zip(failed, branch(BranchInput(inp, failed)))}
    rows = [_failed_row(p, g[0], branched[p.id]) if p.id in branched
            else outcome(p, g, g[0], failed=False, answered_by_checker=True)
            for p, g in zip(inp.problems, first)]
    return MethodResult(rows, ttel_stats(rows))
