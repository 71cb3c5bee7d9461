"""Planner-executor-reviewer (PER) against broadcast peer review and peer discussion, over one
model playing every role (``facts`` plans, ``solve`` executes, ``review`` judges, ``revise``
repairs).

Only the abstract of the PER study was available; the protocols and metrics follow the
project's reading (es-next.md section 6), with the verifier as ground truth:

- ``per``: M pipelines; each plans (the ``facts`` line), executes the plan (the solve part
  of the facts completion, continued from the plan), is reviewed once, and on a rejection
  is repaired once with the critique;
- ``broadcast``: M peers solve; every peer reviews every other peer's solution; a solution
  most of whose reviews reject it is repaired with the step most reviews flagged;
- ``discussion``: M peers solve; each peer reads the other peers' answers and writes a
  revised solution (one round), the source's broadcast-style discussion;
- all three commit to the vote of their M final solutions.

Reviewer precision is P(solution wrong | rejected) and recall P(rejected | wrong), over every
review (a review with no verdict counts as not rejecting). Critique uptake is the share of
repairs after a localised critique whose answer changed and whose edit touches the flagged
step; it is also given apart over the useful critiques (the flagged step is the verifier's
first wrong step of the draft, ``first_wrong_step``) and over the others, each group with its
repair rate P(correct after | wrong draft), since an uptake averaged over all critiques
mixes following good advice with following bad. The reviewer-guided repair rate
P(correct after | wrong, rejected) is read against self-repair: every wrong draft is also
revised with the no-information critique ``check`` (a control, not part of the method's
cost).
"""

from __future__ import annotations

import difflib
from collections import Counter

import numpy as np

from es_llm.tasks import Problem
from es_llm.tasks.countdown_roles import (SELF_REPAIR, critique_line, first_wrong_step,
                                          parse_steps, parse_verdict)
from es_llm.testtime.generations import Gen
from es_llm.testtime.methods import (MethodInput, MethodResult, mean_or_none, outcome, prompt,
                                     register_method, vote)


def edited_steps(before: str, after: str) -> set[int]:
    """The 1-based steps of ``before`` that ``after`` changed (replaced, deleted, or with
    something inserted in front of them), by difflib over the written steps."""
    old = [s.text() if s else "?" for s in parse_steps(before)]
    new = [s.text() if s else "?" for s in parse_steps(after)]
    touched: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            touched.update(range(i1 + 1, i2 + 1))
        elif tag == "insert":
            touched.add(i1 + 1)
    return touched


def repair_row(problem: Problem, before: Gen, after: Gen, verdict: tuple | None) -> dict:
    """One repair as ``review_metrics`` reads it: whether the draft was wrong and the repair
    correct, the step the critique flagged (None: no location), the verifier's first wrong
    step of the draft (None: a clean trace), both texts, and whether the answer changed."""
    numbers, target = problem.gold["numbers"], problem.gold["target"]
    return {"wrong_before": not before.correct, "correct_after": after.correct,
            "flagged": verdict[1] if verdict is not None else None,
            "first_wrong": first_wrong_step(numbers, target, before.text),
            "before": before.text, "after": after.text,
            "changed": after.value != before.value or after.answer != before.answer}


def _uptake(repairs: list[dict]) -> float | None:
    """The share of localised repairs whose answer changed and whose edit touches the
    flagged step."""
    return mean_or_none([r["changed"] and r["flagged"] in edited_steps(r["before"], r["after"])
                         for r in repairs])


def _repair_rate(repairs: list[dict]) -> float | None:
    """P(correct after | wrong draft) over ``repairs``."""
    return mean_or_none([r["correct_after"] for r in repairs if r["wrong_before"]])


def review_metrics(reviews: list[tuple[bool, tuple | None]], repairs: list[dict],
                   controls: list[bool]) -> dict:
    """The protocol statistics.

    ``reviews``: (solution wrong by the verifier, parsed verdict or None) per review.
    ``repairs``: ``repair_row`` per repair. ``controls``: whether each self-repair of a wrong
    draft came out correct. Uptake is over localised critiques only (an unlocalised one
    names no step to touch); ``useful`` critiques flag the verifier's first wrong step. On
    a draft whose steps all check but miss the target that is the last step, though an
    earlier operator, carried on, may be the cause: such a critique counts as other.
    """
    rejected = [(wrong, v is not None and v[0] == "wrong") for wrong, v in reviews]
    localized = [r for r in repairs if r["flagged"] is not None]
    useful = [r for r in localized if r["flagged"] == r["first_wrong"]]
    other = [r for r in localized if r["flagged"] != r["first_wrong"]]
    return {
        "reviews": len(reviews),
        "unparsed_verdicts": sum(v is None for _, v in reviews),
        "reviewer_precision": mean_or_none([w for w, r in rejected if r]),
        "reviewer_recall": mean_or_none([r for w, r in rejected if w]),
        "repairs": len(repairs),
        "critique_uptake": _uptake(localized),
        "useful_critiques": len(useful),
        "other_critiques": len(other),
        "critique_uptake_useful": _uptake(useful),
        "critique_uptake_other": _uptake(other),
        "repair_rate_useful": _repair_rate(useful),
        "repair_rate_other": _repair_rate(other),
        "guided_repair_rate": _repair_rate(repairs),
        "self_repair_rate": mean_or_none(controls),
    }


def _repair(inp: MethodInput, jobs: list[tuple], stage: str, control: bool = False
            ) -> list[Gen]:
    """One revise completion per ``(problem, trace, critique)``."""
    outs = inp.gen.draw(inp.label, stage, [(p, prompt(p, "revise", trace=t, critique=c))
                                           for p, t, c in jobs],
                        1, inp.cfg.max_tokens, control=control)
    return [g[0] for g in outs]


def _finish(inp: MethodInput, drafts: dict, reviews: list, rejects: dict) -> MethodResult:
    """Repair the rejected drafts, run the self-repair control, vote, and measure.

    ``drafts[pid]``: the M draft Gens; ``rejects[(pid, j)]``: the verdict a rejected draft
    is repaired with.
    """
    keys = sorted(rejects)
    by_id = {p.id: p for p in inp.problems}
    fixed = _repair(inp, [(by_id[pid], drafts[pid][j].text, critique_line(rejects[(pid, j)]))
                          for pid, j in keys], "repair")
    repaired = dict(zip(keys, fixed))
    wrong = [(pid, j) for pid, gens in drafts.items() for j, g in enumerate(gens)
             if not g.correct]
    controls = _repair(inp, [(by_id[pid], drafts[pid][j].text, SELF_REPAIR)
                             for pid, j in wrong], "self-repair", control=True)
    repairs = [repair_row(by_id[pid], drafts[pid][j], g, rejects[(pid, j)])
               for (pid, j), g in repaired.items()]
    rows = []
    for p in inp.problems:
        finals = [repaired.get((p.id, j), g) for j, g in enumerate(drafts[p.id])]
        rows.append(outcome(p, drafts[p.id] + finals, vote(finals),
                            draft_vote_correct=bool(vote(drafts[p.id]).correct)))
    stats = review_metrics(reviews, repairs, [g.correct for g in controls])
    stats["draft_vote_accuracy"] = float(np.mean([r["draft_vote_correct"] for r in rows]))
    stats["final_accuracy"] = float(np.mean([r["answered"] for r in rows]))
    return MethodResult(rows, stats)


def _review(inp: MethodInput, jobs: list[tuple]) -> list[tuple | None]:
    """The parsed verdict of one review per ``(problem, trace)``."""
    outs = inp.gen.draw(inp.label, "review", [(p, prompt(p, "review", trace=t)) for p, t in jobs],
                        1, inp.cfg.review_tokens, answers=False)
    return [parse_verdict(g[0].text) for g in outs]


@register_method("per", roles=("facts", "solve", "review", "revise"), unit="pipelines")
def per(inp: MethodInput) -> MethodResult:
    plans = inp.gen.draw(inp.label, "plan", [(p, prompt(p, "facts")) for p in inp.problems],
                         inp.budget, inp.cfg.plan_tokens, stop=("\n",), answers=False)
    jobs = [(p, prompt(p, "facts") + plan.text.strip() + "\n")
            for p, ps in zip(inp.problems, plans) for plan in ps]
    executed = inp.gen.draw(inp.label, "execute", jobs, 1, inp.cfg.max_tokens)
    drafts: dict[str, list[Gen]] = {p.id: [] for p in inp.problems}
    for (p, _), g in zip(jobs, executed):
        drafts[p.id].append(g[0])
    order = [(p, j) for p in inp.problems for j in range(inp.budget)]
    verdicts = _review(inp, [(p, drafts[p.id][j].text) for p, j in order])
    reviews = [(not drafts[p.id][j].correct, v) for (p, j), v in zip(order, verdicts)]
    rejects = {(p.id, j): v for (p, j), v in zip(order, verdicts)
               if v is not None and v[0] == "wrong"}
    return _finish(inp, drafts, reviews, rejects)


@register_method("broadcast", roles=("solve", "review", "revise"), unit="peers")
def broadcast(inp: MethodInput) -> MethodResult:
    outs = inp.gen.draw(inp.label, "solve", [(p, prompt(p, "solve")) for p in inp.problems],
                        inp.budget, inp.cfg.max_tokens)
    drafts = {p.id: gens for p, gens in zip(inp.problems, outs)}
    order = [(p, i, j) for p in inp.problems for i in range(inp.budget)
             for j in range(inp.budget) if i != j]
    verdicts = _review(inp, [(p, drafts[p.id][j].text) for p, _, j in order])
    reviews = [(not drafts[p.id][j].correct, v) for (p, _, j), v in zip(order, verdicts)]
    received: dict[tuple, list] = {}
    for (p, _, j), v in zip(order, verdicts):
        received.setdefault((p.id, j), []).append(v)
    rejects = {}
    for key, vs in received.items():
        against = [v for v in vs if v is not None and v[0] == "wrong"]
        if len(against) * 2 > len(vs):
            steps = Counter(v[1] for v in against if v[1] is not None)
            rejects[key] = ("wrong", steps.most_common(1)[0][0] if steps else None)
    return _finish(inp, drafts, reviews, rejects)


def peer_line(answers: list[str | None]) -> str:
    """The critique line of a discussion revision: ``peers`` and the other peers' answers in
    order, ``none`` for a peer that gave none (spaces dropped, so each answer is one word)."""
    return " ".join(["peers"] + ["".join(a.split()) if a else "none" for a in answers])


def discussion_stats(pairs: list[tuple[Gen, Gen, list]]) -> dict:
    """What one round of discussion did, per peer ``(draft, revision, the other peers'
    answer values)``: the share of revisions whose answer changed, the repair rate
    P(correct after | wrong draft), the break rate P(wrong after | correct draft), and the
    share of changed revisions that adopted an answer some other peer gave."""
    changed = [(d, r, peers) for d, r, peers in pairs if r.value != d.value]
    return {
        "revision_changed": mean_or_none([r.value != d.value for d, r, _ in pairs]),
        "discussion_repair_rate": mean_or_none([r.correct for d, r, _ in pairs
                                                if not d.correct]),
        "discussion_break_rate": mean_or_none([not r.correct for d, r, _ in pairs
                                               if d.correct]),
        "adopted_peer_answer": mean_or_none([r.value is not None and r.value in peers
                                             for _, r, peers in changed]),
    }


@register_method("discussion", roles=("solve", "revise"), min_budget=2, unit="peers")
def discussion(inp: MethodInput) -> MethodResult:
    """M peers solve; each then reads the other peers' answers and writes a revised solution
    (one round); the method commits to the vote of the revisions.

    Departure: the source's peers read each other's solutions; the testbed model has no
    discussion role, so a revision is the trained ``revise`` prompt with the peer's own
    draft as the trace and ``peer_line`` (the other peers' answers only: their whole traces
    would overrun the model's 256-token character context within a few peers) as the
    critique line. The revise role was trained on the critiques ``wrong at step k``,
    ``wrong`` and ``check`` only, so this critique line is a form it never saw in training.
    """
    outs = inp.gen.draw(inp.label, "solve", [(p, prompt(p, "solve")) for p in inp.problems],
                        inp.budget, inp.cfg.max_tokens)
    jobs, others = [], []
    for p, drafts in zip(inp.problems, outs):
        for i, draft in enumerate(drafts):
            peers = drafts[:i] + drafts[i + 1:]
            jobs.append((p, prompt(p, "revise", trace=draft.text,
                                   critique=peer_line([g.answer for g in peers]))))
            others.append([g.value for g in peers if g.value is not None])
    revised = iter(g[0] for g in inp.gen.draw(inp.label, "discuss", jobs, 1,
                                              inp.cfg.max_tokens))
    peer_values = iter(others)
    rows, pairs = [], []
    for p, drafts in zip(inp.problems, outs):
        finals = [next(revised) for _ in drafts]
        pairs += [(d, f, next(peer_values)) for d, f in zip(drafts, finals)]
        rows.append(outcome(p, drafts + finals, vote(finals),
                            draft_vote_correct=bool(vote(drafts).correct)))
    stats = discussion_stats(pairs)
    stats["draft_vote_accuracy"] = mean_or_none([r["draft_vote_correct"] for r in rows])
    stats["final_accuracy"] = mean_or_none([r["answered"] for r in rows])
    return MethodResult(rows, stats)
