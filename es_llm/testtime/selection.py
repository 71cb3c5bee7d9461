"""BASE answer selection (Feng & Shi 2026, "Formalize Once, Edit the Rest"): formalise one
base candidate, derive the other K-1 checkable statements by editing its answer in place.

BASE formalises into Lean with an autoformaliser model and checks with a Lean server. Lean
cannot be installed on the project's machines (no offline package ships it or Mathlib), so
the formal language here is a small statement over the problem with an exact checker
(``countdown_roles.statement``)::

    thm 7*3+4 = 25 ; 7*3+4 uses 3 4 7

The autoformaliser is the reasoning model's ``formalize`` role: a trained model, so what it
writes can be wrong (a misplaced number or target, an answer copied wrong), as BASE's is.
``check`` parses a statement and decides it with ``fractions.Fraction`` arithmetic, never
``eval``, and reads only the statement: a statement that misstates the problem can pass a
wrong answer, the faithfulness risk BASE takes. ``edit`` is R1, the rule-based edit: the
base answer must fill both answer slots of the statement as the formaliser wrote it, and
is replaced there by a safe candidate (digits, ``+ - * / ( )`` and spaces).

Three methods read the same K candidates (one candidate stream, so their rows pair):

- ``base_select``: BASE. The model formalises the base candidate (the first safe one in
  rank order, mean token log-probability) and R1 edits its statement for the others.
  Departures: where R1 cannot edit (the base answer is not in both slots of what the model
  wrote), that candidate is formalised by the model, where BASE's R2 asks a second model
  for an edit function; a base statement that does not parse counts as a failed
  formalisation and the next safe candidate becomes the base.
- ``formalize_all``: the model formalises every safe candidate (K calls), the baseline BASE
  saves against.
- ``base_oracle``: the template statement of each candidate, exact by construction and free:
  the upper bound a perfect formaliser gives, not a method a user without one can run (on a
  model that knows only ``solve``, e.g. the student in ``compare``, it is the BASE
  selection rule with a perfect checker).

Selection, for each: ``first_pass`` commits to the first candidate in rank order whose
statement checks; ``unique_pass`` selects only when exactly one distinct answer checks
(Countdown often has several correct answers, so it abstains more).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from es_llm.tasks import countdown
from es_llm.tasks.countdown_roles import parse_problem, statement
from es_llm.testtime.generations import Gen
from es_llm.testtime.methods import MethodInput, MethodResult, outcome, prompt, register_method

_SAFE_RE = re.compile(r"[0-9+\-*/() ]{1,64}")
_STATEMENT_RE = re.compile(r"thm ([0-9+\-*/() ]{1,64}) = ([0-9]{1,9}) ; "
                           r"([0-9+\-*/() ]{1,64}) uses ((?:[0-9]{1,6} )*[0-9]{1,6})")


@dataclass(frozen=True)
class Statement:
    """A checkable statement and the answer text R1 looks for in its slots."""

    text: str
    slot: str


def safe(answer: str | None) -> bool:
    """Whether an answer may be pasted into a statement."""
    return answer is not None and _SAFE_RE.fullmatch(answer.strip()) is not None


def _norm(answer: str) -> str:
    return " ".join(answer.split())


def oracle_statement(problem_prompt: str, answer: str) -> Statement | None:
    """The template statement that ``answer`` solves the problem of ``problem_prompt``; None
    if the prompt is no Countdown problem or the answer is not safe to paste."""
    parsed = parse_problem(problem_prompt)
    if parsed is None or not safe(answer):
        return None
    return Statement(statement(*parsed, answer), _norm(answer))


def parse_statement(text: str, answer: str) -> Statement | None:
    """A formaliser's output as the statement of candidate ``answer``; None when it is no
    statement of the language (a failed formalisation: counted, never run)."""
    text = _norm(text)
    return Statement(text, _norm(answer)) if _STATEMENT_RE.fullmatch(text) else None


def edit(base: Statement, answer: str | None) -> Statement | None:
    """R1: ``base`` with ``answer`` in both answer slots, where the base answer stood; None for
    an unsafe answer, or when the base answer does not fill both slots (R1 cannot edit)."""
    m = _STATEMENT_RE.fullmatch(base.text)
    if not safe(answer) or m is None or not m[1] == m[3] == base.slot:
        return None
    a = _norm(answer)
    return Statement(f"thm {a} = {m[2]} ; {a} uses {m[4]}", a)


def check(s: Statement) -> bool:
    """Whether the statement holds: both slots hold the same expression, over exactly the
    listed numbers, whose exact value is the stated target."""
    m = _STATEMENT_RE.fullmatch(s.text)
    if m is None or m[1] != m[3]:
        return False
    try:
        tree = countdown.parse_expression(m[1])
        return (sorted(countdown.leaves(tree)) == sorted(int(x) for x in m[4].split())
                and countdown.evaluate(tree) == int(m[2]))
    except (countdown._Rejected, ZeroDivisionError):
        return False


# ``formalize(pairs) -> statements``: one statement (or None) for each (problem index,
# candidate index) pair, drawn in one batch.
Formalizer = Callable[[list[tuple[int, int]]], list[Statement | None]]


def statements_base_and_edit(answers_P: Sequence[Sequence[str | None]], formalize: Formalizer
                             ) -> tuple[list[list[Statement | None]], list[dict]]:
    """BASE's statements for every candidate of every problem, and per problem the
    formaliser calls, failed formalisations and R1 edits made. Bases are formalised in
    rounds (a problem whose base statement does not parse moves to its next safe
    candidate), then every other candidate is edited, and the ones R1 cannot edit are
    formalised in one more batch."""
    P = len(answers_P)
    out: list[list[Statement | None]] = [[None] * len(a) for a in answers_P]
    log = [{"formalizer_calls": 0, "failed_formalizations": 0, "edits": 0} for _ in range(P)]
    queue = [[k for k, a in enumerate(answers) if safe(a)] for answers in answers_P]
    base: list[int | None] = [None] * P
    while pending := [p for p in range(P) if base[p] is None and queue[p]]:
        pairs = [(p, queue[p].pop(0)) for p in pending]
        for (p, k), s in zip(pairs, formalize(pairs)):
            log[p]["formalizer_calls"] += 1
            if s is None:
                log[p]["failed_formalizations"] += 1
            else:
                base[p], out[p][k] = k, s
    fallback = []
    for p in range(P):
        for k in queue[p] if base[p] is not None else []:
            edited = edit(out[p][base[p]], answers_P[p][k])
            if edited is None:
                fallback.append((p, k))
            else:
                out[p][k] = edited
                log[p]["edits"] += 1
    _formalize_into(out, log, fallback, formalize)
    return out, log


def statements_every(answers_P: Sequence[Sequence[str | None]], formalize: Formalizer
                     ) -> tuple[list[list[Statement | None]], list[dict]]:
    """Every safe candidate formalised on its own (K formaliser calls per problem)."""
    out: list[list[Statement | None]] = [[None] * len(a) for a in answers_P]
    log = [{"formalizer_calls": 0, "failed_formalizations": 0, "edits": 0} for _ in answers_P]
    _formalize_into(out, log, [(p, k) for p, answers in enumerate(answers_P)
                               for k, a in enumerate(answers) if safe(a)], formalize)
    return out, log


def _formalize_into(out, log, pairs, formalize: Formalizer) -> None:
    for (p, k), s in zip(pairs, formalize(pairs) if pairs else []):
        out[p][k] = s
        log[p]["formalizer_calls"] += 1
        log[p]["failed_formalizations"] += s is None


def decide(answers: Sequence[str | None], statements: Sequence[Statement | None]) -> dict:
    """Check every statement; the index chosen by ``first_pass`` and ``unique_pass`` (None
    when nothing is chosen), the pass flags and the checker calls made."""
    passes = [s is not None and check(s) for s in statements]
    passing = [i for i, ok in enumerate(passes) if ok]
    distinct = {_canonical(answers[i]) for i in passing}
    return {"first_pass": passing[0] if passing else None,
            "unique_pass": passing[0] if len(distinct) == 1 else None,
            "passes": passes, "checker_calls": sum(s is not None for s in statements),
            "ambiguous": len(distinct) > 1}


def _canonical(answer: str) -> str:
    """An answer's canonical rendering; its own text when it does not parse (a model's
    statement can pass a candidate whose answer is no expression: what it wrote was checked,
    not the candidate)."""
    try:
        return countdown.render(countdown.parse_expression(answer.strip()))
    except countdown._Rejected:
        return _norm(answer)


def _ranked_candidates(inp: MethodInput) -> list[list[Gen]]:
    """K solve candidates per problem, ranked by mean token log-probability; drawn from one
    stream shared by the three selection methods, so they select among the same samples."""
    outs = inp.gen.draw(inp.label, "candidate", [(p, prompt(p, "solve")) for p in inp.problems],
                        inp.budget, inp.cfg.max_tokens, logprobs=True, stream="base")
    return [sorted(gens, key=lambda g: -float(np.mean(g.logprobs)) if g.logprobs else 0.0)
            for gens in outs]


def _model_formalizer(inp: MethodInput, ranked: list[list[Gen]]) -> Formalizer:
    rounds = itertools.count()  # each batch its own stage: its own sampling streams

    def formalize(pairs: list[tuple[int, int]]) -> list[Statement | None]:
        jobs = [(inp.problems[p], prompt(inp.problems[p], "formalize",
                                         trace=_norm(ranked[p][k].answer))) for p, k in pairs]
        outs = inp.gen.draw(inp.label, f"formalize-{next(rounds)}", jobs, 1,
                            inp.cfg.formalize_tokens, answers=False,
                            temperature=inp.cfg.formalize_temperature)
        return [parse_statement(o[0].text, ranked[p][k].answer) for (p, k), o in zip(pairs, outs)]

    return formalize


def _oracle_formalizer(inp: MethodInput, ranked: list[list[Gen]]) -> Formalizer:
    return lambda pairs: [oracle_statement(prompt(inp.problems[p], "solve"), ranked[p][k].answer)
                          for p, k in pairs]


def _selection(formalizer: Callable[[MethodInput, list[list[Gen]]], Formalizer],
               statements: Callable) -> Callable[[MethodInput], MethodResult]:
    def run(inp: MethodInput) -> MethodResult:
        ranked = _ranked_candidates(inp)
        answers_P = [[g.answer for g in gens] for gens in ranked]
        stmts_P, log = statements(answers_P, formalizer(inp, ranked))
        rows = []
        for p, gens, answers, stmts, made in zip(inp.problems, ranked, answers_P, stmts_P, log):
            chosen = decide(answers, stmts)
            first = gens[chosen["first_pass"]] if chosen["first_pass"] is not None else None
            unique = gens[chosen["unique_pass"]] if chosen["unique_pass"] is not None else None
            # Faithful: what the template writes for the same candidate.
            faithful = sum(s.text == oracle_statement(prompt(p, "solve"), s.slot).text
                           for s in stmts if s is not None)
            rows.append(outcome(
                p, gens, first, unique_pass=bool(unique and unique.correct),
                checker_calls=chosen["checker_calls"], ambiguous=chosen["ambiguous"],
                statements=sum(s is not None for s in stmts), faithful=faithful, **made,
                false_passes=sum(ok and not g.correct for ok, g in zip(chosen["passes"], gens)),
                missed=sum(g.correct and not ok for ok, g in zip(chosen["passes"], gens))))
        return MethodResult(rows, _selection_stats(rows, inp.budget))

    return run


def _selection_stats(rows: list[dict], k: int) -> dict:
    gt = [r["covered"] for r in rows]
    made = sum(r["statements"] for r in rows)
    calls = sum(r["formalizer_calls"] for r in rows)

    def conditional(key: str) -> float | None:
        return float(np.mean([r[key] for r in rows if r["covered"]])) if any(gt) else None

    return {
        "gt_at_k": float(np.mean(gt)),
        "accuracy_first_pass": float(np.mean([r["answered"] for r in rows])),
        "accuracy_unique_pass": float(np.mean([r["unique_pass"] for r in rows])),
        "conditional_first_pass": conditional("answered"),
        "conditional_unique_pass": conditional("unique_pass"),
        "ambiguous_share": float(np.mean([r["ambiguous"] for r in rows])),
        "formalizer_calls_per_problem": calls / len(rows),
        "formalizer_calls_if_every_candidate": float(k),
        "failed_formalization_rate": (sum(r["failed_formalizations"] for r in rows) / calls
                                      if calls else None),
        "faithful_statement_rate": sum(r["faithful"] for r in rows) / made if made else None,
        "edits_per_problem": float(np.mean([r["edits"] for r in rows])),
        "false_passes_per_problem": float(np.mean([r["false_passes"] for r in rows])),
        "missed_correct_per_problem": float(np.mean([r["missed"] for r in rows])),
        "checker_calls_per_problem": float(np.mean([r["checker_calls"] for r in rows]))}


register_method("base_select", roles=("solve", "formalize"), min_budget=2, unit="candidates")(
    _selection(_model_formalizer, statements_base_and_edit))
register_method("formalize_all", roles=("solve", "formalize"), min_budget=2, unit="candidates")(
    _selection(_model_formalizer, statements_every))
register_method("base_oracle", roles=("solve",), min_budget=2, unit="candidates")(
    _selection(_oracle_formalizer, statements_base_and_edit))
