"""How well a multi-role model plays each role on held-out problems (greedy decoding).

- ``solve``, ``direct``, ``facts``: accuracy; for facts also the share of true fact lines;
- ``review``: on the held-out problems' clean traces (label ``ok``) and on the same number of
  traces with a planted error (``countdown_roles.planted_error``, labelled by the verifier):
  precision P(wrong | says wrong), recall P(says wrong | wrong), and the share of
  localised rejections of a wrong trace that name the verifier's step;
- ``revise``: on the planted-error traces, the share repaired to a correct answer under each
  critique (the verifier's step, ``wrong`` alone, ``check``), and the share of clean traces
  still correct after ``check``;
- ``formalize``: each problem's clean answer and its planted error's answer formalised: the
  share of outputs that parse, that equal the template statement (faithful), and that check,
  for the right and the wrong answers apart (a wrong answer that checks is a false pass).

The planted errors are drawn from a ``random.Random`` seeded with ``seed``, so the figures are
a pure function of the model, the problems and the seed.
"""

from __future__ import annotations

import random

import numpy as np

from es_llm.backends.base import SamplingParams
from es_llm.tasks import countdown
from es_llm.tasks.countdown_roles import (NO_LOCATION, SELF_REPAIR, parse_verdict,
                                          planted_error, role_prompt, statement)
from es_llm.testtime.methods import facts_hold


def _greedy(backend, prompts: list[str], max_tokens: int) -> list[str]:
    outs = backend.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens))
    return [o[0].text for o in outs]


def _correct(problem, text: str) -> bool:
    g = problem.gold
    return countdown.score_completion(g["numbers"], g["target"], text).correct


def role_accuracy(backend, problems: list, seed: int = 0, max_tokens: int = 96) -> dict:
    """Per-role held-out figures of the model behind ``backend`` (see the module text)."""
    rng = random.Random(seed)
    g = [(p.gold["numbers"], p.gold["target"]) for p in problems]
    out: dict = {"problems": len(problems)}
    for role in ("solve", "direct", "facts"):
        texts = _greedy(backend, [role_prompt(role, *x) for x in g], max_tokens)
        out[role] = {"accuracy": float(np.mean([_correct(p, t) for p, t in zip(problems, texts)]))}
        if role == "facts":
            out[role]["facts_true"] = float(np.mean([facts_hold(t, x[1])
                                                     for t, x in zip(texts, g)]))
    clean = [p.meta["reference"] for p in problems]
    planted = []
    for p, ref in zip(problems, clean):
        made = None
        for _ in range(20):
            made = planted_error(rng, p, ref)
            if made is not None:
                break
        planted.append(made)
    wrong = [(p, x, m) for p, x, m in zip(problems, g, planted) if m is not None]
    traces = [(x, ref, None) for x, ref in zip(g, clean)] + [(x, m[0], m[1]) for _, x, m in wrong]
    verdicts = [parse_verdict(t) for t in _greedy(
        backend, [role_prompt("review", *x, trace=t) for x, t, _ in traces], 24)]
    says_wrong = [v is not None and v[0] == "wrong" for v in verdicts]
    is_wrong = [label is not None for _, _, label in traces]
    rejected_wrong = [v for v, w in zip(verdicts, is_wrong) if w and v and v[0] == "wrong"]
    located = [v[1] == label for v, (_, _, label) in zip(verdicts, traces)
               if label is not None and v and v[0] == "wrong" and v[1] is not None]
    out["review"] = {
        "traces": len(traces), "wrong_traces": sum(is_wrong),
        "precision": _share([w for w, s in zip(is_wrong, says_wrong) if s]),
        "recall": _share([s for w, s in zip(is_wrong, says_wrong) if w]),
        "unparsed": _share([v is None for v in verdicts]),
        "located_step": _share(located), "rejections_of_wrong": len(rejected_wrong)}
    out["revise"] = {}
    for name, critique in (("with_step", None), ("wrong_only", NO_LOCATION),
                           ("self_repair", SELF_REPAIR)):
        prompts = [role_prompt("revise", *x, trace=m[0],
                               critique=critique or f"wrong at step {m[1]}") for _, x, m in wrong]
        texts = _greedy(backend, prompts, max_tokens)
        out["revise"][name] = _share([_correct(p, t) for (p, _, _), t in zip(wrong, texts)])
    texts = _greedy(backend, [role_prompt("revise", *x, trace=ref, critique=SELF_REPAIR)
                              for x, ref in zip(g, clean)], max_tokens)
    out["revise"]["clean_kept"] = _share([_correct(p, t) for p, t in zip(problems, texts)])
    out["formalize"] = _formalize(backend, [(x, ref) for x, ref in zip(g, clean)],
                                  [(x, m[0]) for _, x, m in wrong])
    return out


def _formalize(backend, right: list, wrong: list) -> dict:
    """The formalize role on right and wrong candidates (``((numbers, target), trace)``)."""
    from es_llm.testtime.selection import check, parse_statement

    out = {}
    for name, cases in (("right", right), ("wrong", wrong)):
        answers = [countdown.extract_answer(t)[0] or "" for _, t in cases]
        texts = _greedy(backend, [role_prompt("formalize", *x, trace=a)
                                  for (x, _), a in zip(cases, answers)], 64)
        made = [parse_statement(t, a) for t, a in zip(texts, answers)]
        out[name] = {
            "candidates": len(cases), "parsed": _share([s is not None for s in made]),
            "faithful": _share([s is not None and s.text == statement(*x, a)
                                for s, (x, _), a in zip(made, cases, answers)]),
            "checks": _share([s is not None and check(s) for s in made])}
    return out


def _share(values: list[bool]) -> float | None:
    return float(np.mean(values)) if values else None
