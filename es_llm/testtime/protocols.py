"""Planner-executor-reviewer (PER) against broadcast peer discussion, over one model playing
every role (``facts`` plans, ``solve`` executes, ``review`` judges, ``revise`` repairs).

Only the abstract of the PER study was available; the protocols and metrics follow the
project's reading (es-next.md section 6), with the verifier as ground truth:

- ``per``: M pipelines; each plans (the ``facts`` line), executes the plan (the solve part
  of the facts completion, continued from the plan), is reviewed once, and on a rejection
  is repaired once with the critique;
- ``broadcast``: M peers solve; every peer reviews every other peer's solution; a solution
  most of whose reviews reject it is repaired with the step most reviews flagged;
- both commit to the vote of their M final solutions.

Reviewer precision is P(solution wrong | rejected) and recall P(rejected | wrong). Critique
uptake is the share of repairs after a localised critique whose answer changed and whose
edit touches the flagged step. The reviewer-guided repair rate P(correct after | wrong,
rejected) is read against self-repair: every wrong draft is also revised with the
no-information critique ``check`` (a control, not part of the method's cost).
"""

from __future__ import annotations

import difflib
from collections import Counter

import numpy as np

from es_llm.tasks.countdown_roles import (SELF_REPAIR, critique_line, parse_steps,
                                          parse_verdict)
from es_llm.testtime.generations import Gen
from es_llm.testtime.methods import (MethodInput, MethodResult, outcome, prompt,
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


def review_metrics(reviews: list[tuple[bool, tuple | None]], repairs: list[dict],
                   controls: list[bool]) -> dict:
    """The protocol statistics.

    ``reviews``: (solution wrong by the verifier, parsed verdict or None) per review.
    ``repairs``: per repair ``wrong_before``, ``correct_after``, ``flagged`` (the critique's
    step or None), ``before``/``after`` texts and ``changed`` (the answer differs).
    ``controls``: whether each self-repair of a wrong draft came out correct.
    """
    rejected = [(wrong, v is not None and v[0] == "wrong") for wrong, v in reviews]
    rej = [w for w, r in rejected if r]
    wrong = [r for w, r in rejected if w]
    localized = [r for r in repairs if r["flagged"] is not None]
    guided = [r["correct_after"] for r in repairs if r["wrong_before"]]
    return {
        "reviews": len(reviews),
        "unparsed_verdicts": sum(v is None for _, v in reviews),
        "reviewer_precision": float(np.mean(rej)) if rej else None,
        "reviewer_recall": float(np.mean(wrong)) if wrong else None,
        "repairs": len(repairs),
        "critique_uptake": (float(np.mean([r["changed"] and r["flagged"] in
                                           edited_steps(r["before"], r["after"])
                                           for r in localized])) if localized else None),
        "guided_repair_rate": float(np.mean(guided)) if guided else None,
        "self_repair_rate": float(np.mean(controls)) if controls else None,
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
    repairs = [{"wrong_before": not drafts[pid][j].correct, "correct_after": g.correct,
                "flagged": rejects[(pid, j)][1], "before": drafts[pid][j].text,
                "after": g.text, "changed": g.value != drafts[pid][j].value
                or g.answer != drafts[pid][j].answer}
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
