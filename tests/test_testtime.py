"""Test-time methods: hand-computed maths (isotonic map, curves), TTEL's localisation on a
scripted model, BASE's editing and selection rules, the review-protocol metrics on scripted
transcripts, the roles' formats, and every method end to end on the ci reasoning model."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from es_llm.cli import main
from es_llm.tasks import Problem, countdown
from es_llm.tasks import countdown_roles as R
from es_llm.testtime.curves import (dominates, isotonic_fit, isotonic_predict, log_auc,
                                    pareto_front, step_curve)
from es_llm.testtime.dart import drafts_agree, think_budget
from es_llm.testtime.methods import METHODS, TestTimeSettings, facts_hold
from es_llm.testtime.generations import Gen
from es_llm.testtime.protocols import edited_steps, review_metrics
from es_llm.tasks.countdown_roles import statement
from es_llm.testtime.selection import (check, decide, edit, oracle_statement, parse_statement,
                                       statements_base_and_edit, statements_every)
from es_llm.testtime.ttel import error_segment, localize, segments


# --------------------------------------------------------------------------------------------
# Curves and the isotonic budget map
# --------------------------------------------------------------------------------------------

def test_isotonic_fit_pools_adjacent_violators_by_hand():
    x, y = isotonic_fit(np.array([1, 2, 3, 4]), np.array([1.0, 3.0, 2.0, 4.0]))
    assert x.tolist() == [1, 2, 3, 4] and y.tolist() == [1.0, 2.5, 2.5, 4.0]
    # Ties in x pool first (x=1: mean 2 of 3 and 1), then the violation with x=2 (0) merges:
    # (3 + 1 + 0) / 3 for both knots.
    x, y = isotonic_fit(np.array([1, 1, 2]), np.array([3.0, 1.0, 0.0]))
    assert x.tolist() == [1, 2] and np.allclose(y, [4 / 3, 4 / 3])
    x, y = isotonic_fit(np.array([0.5, 1.0, 2.0]), np.array([10.0, 20.0, 40.0]))
    assert isotonic_predict(x, y, 1.5) == 30.0 and isotonic_predict(x, y, 9.0) == 40.0
    assert isotonic_predict(x, y, 0.0) == 10.0
    # A chain: 5, 1 pool to 3, 3; then 2 joins them at 8/3; 6 stands until 0 pools it to 3.
    x, y = isotonic_fit(np.arange(5), np.array([5.0, 1.0, 2.0, 6.0, 0.0]))
    assert np.allclose(y, [8 / 3, 8 / 3, 8 / 3, 3.0, 3.0])
    # Unsorted x with a tie: knots 1, 2, 3 at means 3 (two points), 2, 0 pool to 8/4 = 2.
    x, y = isotonic_fit(np.array([3, 1, 2, 1]), np.array([0.0, 4.0, 2.0, 2.0]))
    assert x.tolist() == [1, 2, 3] and np.allclose(y, [2.0, 2.0, 2.0])


def test_think_budget_applies_the_margin_and_the_clip():
    cal = {"knots_entropy": [0.5, 1.0, 2.0], "knots_tokens": [10.0, 20.0, 40.0]}
    cfg = TestTimeSettings(dart_margin=0.5, dart_min_tokens=16, max_tokens=50)
    assert think_budget(cal, 1.5, cfg) == 45  # 30 * 1.5
    assert think_budget(cal, 0.5, cfg) == 16  # 15 clipped up to the minimum
    assert think_budget(cal, 2.0, cfg) == 50  # 60 clipped down to max_tokens


def test_step_curve_area_frontier_and_dominance_by_hand():
    t, s = np.array([10.0, 100.0]), np.array([0.2, 0.6])
    assert step_curve(t, s, 9) == 0.0 and step_curve(t, s, 50) == 0.2 and step_curve(t, s, 100) == 0.6
    # S = 0.2 on one decade, 0.6 on the next: mean 0.4.
    assert log_auc(t, s, 10, 1000) == pytest.approx(0.4)
    better = (t, np.array([0.3, 0.6]))
    assert dominates(better, (t, s), 10, 1000) and not dominates((t, s), better, 10, 1000)
    assert not dominates((t, s), (t, s), 10, 1000)
    front = pareto_front([("a", 10, 0.2), ("b", 20, 0.1), ("c", 100, 0.6), ("d", 100, 0.5)])
    assert [p[0] for p in front] == ["a", "c"]


# --------------------------------------------------------------------------------------------
# Roles
# --------------------------------------------------------------------------------------------

def test_first_wrong_step_labels_by_hand():
    nums, target = [7, 3, 4], 25
    assert R.first_wrong_step(nums, target, "7*3=21 21+4=25 <answer>7*3+4</answer>") is None
    assert R.first_wrong_step(nums, target, "8*3=24 24+4=28 <answer>8*3+4</answer>") == 1
    assert R.first_wrong_step(nums, target, "7*3=22 22+4=26 <answer>7*3+4</answer>") == 1
    assert R.first_wrong_step(nums, target, "7*3=21 21-4=17 <answer>7*3-4</answer>") == 2
    assert R.first_wrong_step(nums, target, "<answer>7*3+4</answer>") == 1
    assert R.parse_verdict("wrong at step 2") == ("wrong", 2)
    assert R.parse_verdict(" ok ") == ("ok", None) and R.parse_verdict("wrong") == ("wrong", None)
    assert R.parse_verdict("fine") is None
    assert R.critique_line(("wrong", 3)) == "wrong at step 3" and R.critique_line(None) == "check"


def test_planted_errors_are_wrong_and_labelled_by_the_verifier():
    rng = random.Random(1)
    made = 0
    for _ in range(300):
        problem, clean = countdown.generate(rng, rng.choice((2, 3, 4)))
        wrong = R.planted_error(rng, problem, clean)
        if wrong is None:
            continue
        made += 1
        text, label = wrong
        g = problem.gold
        assert not countdown.score_completion(g["numbers"], g["target"], text).correct
        assert label == R.first_wrong_step(g["numbers"], g["target"], text)
        # The verifier never flags a step before the first one the error changed.
        ours, theirs = R.parse_steps(text), R.parse_steps(clean)
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs), 1) if a != b)
        assert label >= first
    assert made > 200


def test_role_examples_have_their_formats():
    rng = random.Random(0)
    seen = {}
    for _ in range(400):
        problem, completion = R.generate(rng, 3)
        seen.setdefault(problem.meta["role"], (problem, completion))
    assert set(seen) == set(R.ROLES)
    problem, completion = seen["facts"]
    assert problem.prompt.startswith("facts nums ")
    assert facts_hold(completion, problem.gold["target"])
    assert R.first_wrong_step(problem.gold["numbers"], problem.gold["target"], completion) is None
    assert seen["direct"][1].startswith("<answer>")
    assert R.parse_verdict(seen["review"][1]) is not None
    solve = seen["solve"][0]
    assert solve.prompt == countdown.render_prompt(solve.gold["numbers"], solve.gold["target"])


def test_facts_hold_and_agreement_by_hand():
    assert facts_hold("25=21+4 21=7*3\n7*3=21 21+4=25 <answer>7*3+4</answer>", 25)
    assert not facts_hold("25=21+4 21=7*2\n...", 25)
    assert not facts_hold("24=21+3\n", 25)
    g = lambda v: Gen("", 1, None, "stop", False, v)  # noqa: E731
    assert drafts_agree([g(5), g(5)]) and not drafts_agree([g(5), g(6)])
    assert not drafts_agree([g(None), g(None)])


# --------------------------------------------------------------------------------------------
# TTEL on a scripted model
# --------------------------------------------------------------------------------------------

class _ScriptedScorer:
    """Log-probabilities fixed by the script: -0.1 everywhere, except that under the
    feedback context (the revise prompt whose critique is ``wrong``) the characters of
    ``drop`` cost -6."""

    def __init__(self, drop: str):
        from es_llm.testbed.tokenizer import build_tokenizer

        self.tokenizer, self.drop = build_tokenizer(), drop

    def token_logprobs(self, contexts, continuations):
        out = []
        for ctx, text in zip(contexts, continuations):
            lps = [-0.1] * len(text)
            if ctx.endswith("\nwrong\n"):
                at = text.index(self.drop)
                lps[at:at + len(self.drop)] = [-6.0] * len(self.drop)
            out.append(lps)
        return out


def test_ttel_localizes_where_feedback_lowers_the_probability_most():
    text = "7*3=21 21+5=26 <answer>7*3+5</answer>"
    assert [text[a:b] for a, b in segments(text)] == ["7*3=21", "21+5=26", "<answer>7*3+5</answer>"]
    scorer = _ScriptedScorer(drop="+5")
    ledger = {}
    gen = SimpleNamespace(scorer=scorer,
                          score_tokens=lambda label, jobs: (ledger.setdefault(label, []).extend(jobs)
                                                            or scorer.token_logprobs(
                                                                [c for _, c, _ in jobs],
                                                                [t for _, _, t in jobs])))
    problem = Problem(id="p", prompt="nums 7 3 4 make 25\n",
                      gold={"numbers": [7, 3, 4], "target": 25})
    assert localize(gen, ("ttel", 2), [problem], [text]) == [1]
    # Both contexts were scored over the whole trajectory, the same revise prompt.
    assert [j[1].split(" ")[0] for j in ledger[("ttel", 2)]] == ["revise", "revise"]
    # The gap is taken per token: one big drop beats a wide small one.
    gap = np.array([0.5] * 6 + [0.0] + [0.0, 3.0] + [0.0] * 5)
    assert error_segment([(0, 6), (7, 14)], gap, list(range(len(gap)))) == 1


# --------------------------------------------------------------------------------------------
# BASE
# --------------------------------------------------------------------------------------------

def test_base_formalizes_once_and_edits_the_answer_slot():
    s = oracle_statement("nums 7 3 4 make 25\n", "7*3+4")
    assert s.text == "thm 7*3+4 = 25 ; 7*3+4 uses 3 4 7" and s.slot == "7*3+4"
    assert check(s)
    e = edit(s, "4+3*7")
    assert e.text == s.text.replace("7*3+4", "4+3*7") and check(e)
    assert not check(edit(s, "7*3-4")) and not check(edit(s, "7*4+3"))
    assert not check(edit(s, "5*5"))  # right value, wrong numbers
    assert not check(edit(s, "7**3"))  # pasted (safe characters), refused by the checker
    assert edit(s, "__import__('os')") is None and edit(s, None) is None
    assert oracle_statement("what is 2+2?", "4") is None


def test_a_wrong_formalization_is_caught_or_counted():
    # What the model wrote is checked as written: a misstated target fails a right answer,
    # and an edit is refused when the base answer does not fill both slots (R1 cannot edit).
    assert not check(parse_statement("thm 7*3+4 = 52 ; 7*3+4 uses 3 4 7", "7*3+4"))
    assert not check(parse_statement("thm 7*3+4 = 25 ; 7*3+4 uses 3 4 8", "7*3+4"))
    assert not check(parse_statement("thm 7*3+4 = 25 ; 3*7+4 uses 3 4 7", "7*3+4"))
    miscopied = parse_statement("thm 7*3+5 = 26 ; 7*3+5 uses 3 5 7", "7*3+4")
    assert check(miscopied) and edit(miscopied, "4+3*7") is None
    # Output that is no statement is a failed formalisation, never run.
    assert parse_statement("thm __import__('os') = 1 ; x uses 1", "7*3+4") is None
    assert parse_statement("7*3+4", "7*3+4") is None


def _scripted_formalizer(texts: dict[tuple[int, int], str], answers_P):
    calls = []

    def formalize(pairs):
        calls.append(list(pairs))
        return [parse_statement(texts.get(pk, statement([3, 4, 7], 25, answers_P[pk[0]][pk[1]])),
                                answers_P[pk[0]][pk[1]]) for pk in pairs]

    return formalize, calls


def test_base_and_edit_formalises_once_and_falls_back_where_r1_cannot_edit():
    answers_P = [["7*3+5", "7^3", "3*7+4", "4+3*7"], ["3*7+4", "3*7+4", "7-3"], [None, None]]
    formalize, calls = _scripted_formalizer({}, answers_P)
    stmts, log = statements_base_and_edit(answers_P, formalize)
    assert calls == [[(0, 0), (1, 0)]]  # one batch: each problem's base only
    assert [m["formalizer_calls"] for m in log] == [1, 1, 0]
    assert [m["edits"] for m in log] == [2, 2, 0]
    chosen = decide(answers_P[0], stmts[0])
    assert chosen["passes"] == [False, False, True, True]
    assert chosen["first_pass"] == 2 and chosen["unique_pass"] is None and chosen["ambiguous"]
    assert chosen["checker_calls"] == 3
    chosen = decide(answers_P[1], stmts[1])  # the same answer twice is one distinct answer
    assert chosen["first_pass"] == 0 and chosen["unique_pass"] == 0
    assert decide(answers_P[2], stmts[2])["first_pass"] is None
    # A base the model cannot formalise moves the base on; a base statement whose slots do
    # not hold the base answer sends every other candidate to the formaliser.
    answers_P = [["3*7+4", "7+3+4", "4+3*7"], ["7*3+4", "3*7+4"]]
    formalize, calls = _scripted_formalizer(
        {(0, 0): "thm 3*7+4 = 25 ;", (1, 0): "thm 7*3+5 = 26 ; 7*3+5 uses 3 5 7"}, answers_P)
    stmts, log = statements_base_and_edit(answers_P, formalize)
    assert calls == [[(0, 0), (1, 0)], [(0, 1)], [(1, 1)]]
    assert log[0] == {"formalizer_calls": 2, "failed_formalizations": 1, "edits": 1}
    assert log[1] == {"formalizer_calls": 2, "failed_formalizations": 0, "edits": 0}
    assert decide(answers_P[0], stmts[0])["passes"] == [False, False, True]
    # The miscopied base statement holds on its own terms: checked as written, it passes
    # (the faithfulness risk the checker cannot see).
    assert decide(answers_P[1], stmts[1])["passes"] == [True, True]
    # A candidate that is no expression can still pass through what the model wrote for it.
    passing = parse_statement("thm 7*3+4 = 25 ; 7*3+4 uses 3 4 7", "7**3")
    chosen = decide(["7**3", "3*7+4"], [passing, None])
    assert chosen["first_pass"] == 0 and chosen["unique_pass"] == 0
    # Formalising every candidate: one call per safe candidate, one batch.
    stmts, log = statements_every(answers_P, formalize)
    assert calls[-1] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert [m["formalizer_calls"] for m in log] == [3, 2]


# --------------------------------------------------------------------------------------------
# PER / broadcast metrics on scripted transcripts
# --------------------------------------------------------------------------------------------

def test_edited_steps_by_hand():
    before = "7*3=22 22+4=26 <answer>7*3+4</answer>"
    assert edited_steps(before, "7*3=21 21+4=25 <answer>7*3+4</answer>") == {1, 2}
    assert edited_steps("7*3=21 21-4=17 <answer>7*3-4</answer>",
                        "7*3=21 21+4=25 <answer>7*3+4</answer>") == {2}
    assert edited_steps(before, before) == set()


def test_review_metrics_on_scripted_transcripts():
    reviews = [(True, ("wrong", 2)), (False, ("wrong", 1)), (True, ("ok", None)),
               (False, ("ok", None)), (True, None)]
    repairs = [
        # Flagged step 2, the repair changed steps 1 and 2 and the answer: uptake.
        {"wrong_before": True, "correct_after": True, "flagged": 2, "first_wrong": 1,
         "before": "7*3=22 22+4=26 <answer>7*3+5</answer>",
         "after": "7*3=21 21+4=25 <answer>7*3+4</answer>", "changed": True},
        # Flagged step 1, only step 2 changed: no uptake.
        {"wrong_before": False, "correct_after": False, "flagged": 1, "first_wrong": 2,
         "before": "7*3=21 21-4=17 <answer>7*3-4</answer>",
         "after": "7*3=21 21+4=25 <answer>7*3+4</answer>", "changed": True},
        # A repair without a location does not enter uptake.
        {"wrong_before": True, "correct_after": False, "flagged": None, "first_wrong": 1,
         "before": "8*3=24 <answer>8*3</answer>", "after": "8*3=24 <answer>8*3</answer>",
         "changed": False},
    ]
    m = review_metrics(reviews, repairs, [True, False, False])
    assert m["reviews"] == 5 and m["unparsed_verdicts"] == 1
    assert m["reviewer_precision"] == 0.5  # 2 rejections, 1 of a wrong solution
    assert m["reviewer_recall"] == pytest.approx(1 / 3)  # 3 wrong, 1 rejected
    assert m["critique_uptake"] == 0.5
    assert m["guided_repair_rate"] == 0.5  # two repairs of wrong solutions, one fixed
    assert m["self_repair_rate"] == pytest.approx(1 / 3)


# --------------------------------------------------------------------------------------------
# End to end on the ci reasoning model
# --------------------------------------------------------------------------------------------

def test_reasoning_model_is_built_with_its_roles(ci_reasoning):
    roles = json.loads((ci_reasoning / "roles.json").read_text())["roles"]
    assert roles == list(R.ROLES)
    info = json.loads((ci_reasoning.parent / "testbed.json").read_text())["reasoning"]
    assert info["task"] == "countdown" and info["path"] == "reasoning"
    assert (ci_reasoning / "data" / "countdown_eval.jsonl").is_file()


@pytest.fixture(scope="module")
def every_method(ci_reasoning, tmp_path_factory):
    out = tmp_path_factory.mktemp("testtime")
    code = main(["testtime", "--model", str(ci_reasoning), "--methods", ",".join(METHODS.names()),
                 "--budgets", "2,3", "--limit", "6", "--out", str(out), "--no-progress",
                 # Enough calibration problems that the ci model solves one (DART fits its
                 # budget map on solved problems only).
                 "testtime.calibration_problems=24", "bootstrap=50"])
    assert code == 0
    return out


@pytest.mark.slow
def test_every_method_runs_end_to_end(every_method):
    metrics = json.loads((every_method / "metrics.json").read_text())
    assert set(metrics["methods"]) == set(METHODS.names())
    outcomes = [json.loads(line) for line in (every_method / "outcomes.jsonl").open()]
    assert len(outcomes) == len(METHODS.names()) * 2 * 6
    # A committed answer is one of the method's outputs.
    assert all(o["covered"] or not o["answered"] for o in outcomes)
    assert all(o["tokens"] > 0 for o in outcomes)
    ttel = [o for o in outcomes if o["method"] == "ttel" and o["failed"]]
    assert all(o["scored_tokens"] > 0 for o in ttel)
    for name in ("per", "broadcast"):
        stats = metrics["methods"][name]["budgets"]["2"]["stats"]
        assert stats["reviews"] == (12 if name == "per" else 12)
    # BASE, every candidate formalised, and the oracle select among the same candidates; the
    # model's statements are in the ledger (samples and tokens), the oracle's cost nothing.
    rows = [json.loads(line) for line in (every_method / "samples.jsonl").open()]
    for b in (2, 3):
        mine = {m: [o for o in outcomes if o["method"] == m and o["budget"] == b]
                for m in ("base_select", "formalize_all", "base_oracle")}
        assert len({tuple(o["covered"] for o in v) for v in mine.values()}) == 1
        formal = {m: sum(r["num_tokens"] for r in rows if r["method"] == m
                         and r["budget"] == b and r["stage"].startswith("formalize"))
                  for m in mine}
        assert formal["base_oracle"] == 0 < formal["base_select"] <= formal["formalize_all"]
        for m in ("base_select", "formalize_all"):
            assert sum(o["tokens"] for o in mine[m]) == \
                sum(o["tokens"] for o in mine["base_oracle"]) + formal[m]
            calls = sum(o["formalizer_calls"] for o in mine[m])
            assert calls == sum(1 for r in rows if r["method"] == m and r["budget"] == b
                                and r["stage"].startswith("formalize"))
    # The paired comparisons are the means of per-problem differences.
    assert [(p["first"], p["second"], p["budget"]) for p in metrics["pairs"]] == [
        ("base_select", "formalize_all", 2), ("base_select", "formalize_all", 3),
        ("base_select", "base_oracle", 2), ("base_select", "base_oracle", 3)]
    for p in metrics["pairs"]:
        for key in ("answered", "tokens"):
            a, b = (np.mean([o[key] for o in outcomes if o["method"] == m
                             and o["budget"] == p["budget"]]) for m in (p["first"], p["second"]))
            assert p[key]["difference"] == pytest.approx(a - b)
            assert p[key]["ci95"][0] <= p[key]["difference"] <= p[key]["ci95"][1]
    assert "## Paired comparisons" in (every_method / "report.md").read_text()
    stats = {m: metrics["methods"][m]["budgets"]["3"]["stats"]
             for m in ("base_select", "formalize_all", "base_oracle")}
    assert stats["base_oracle"]["formalizer_calls_per_problem"] <= 1
    assert stats["base_oracle"]["faithful_statement_rate"] == 1.0
    assert stats["base_select"]["formalizer_calls_per_problem"] <= \
        stats["formalize_all"]["formalizer_calls_per_problem"] <= 3
    assert (every_method / "report.md").read_text().startswith("# Test-time methods")
    assert (every_method / "figures" / "success_vs_tokens.png").stat().st_size > 0
    assert set(metrics["curves"]) == {"covered", "answered"}


class _CountingBackend:
    """The HF backend, counting every completion's tokens as it returns them."""

    def __init__(self, inner):
        self.inner, self.name, self.lengths = inner, inner.name, []
        self.model, self.tokenizer = inner.model, inner.tokenizer

    def generate(self, prompts, params, progress=False, keys=None):
        outs = self.inner.generate(prompts, params, progress, keys)
        self.lengths.append(sum(len(c.token_ids) for row in outs for c in row))
        return outs

    def close(self):
        self.inner.close()


@pytest.mark.slow
def test_token_accounting_of_the_independent_baseline(ci_reasoning, tmp_path, monkeypatch):
    import es_llm.testtime.run as run
    from es_llm.backends.hf import HFBackend

    made = []
    monkeypatch.setattr(run, "make_backend", lambda *a, **k: made.append(
        _CountingBackend(HFBackend(str(ci_reasoning)))) or made[-1])
    out = tmp_path / "tt"
    cfg = run.TestTimeConfig(model=str(ci_reasoning), methods=("independent",),
                             budgets=(2, 3), bootstrap=20)
    metrics = run.testtime(cfg, out, progress=False, echo=lambda *_: None)
    outcomes = [json.loads(line) for line in (out / "outcomes.jsonl").open()]
    rows = [json.loads(line) for line in (out / "samples.jsonl").open()]
    problems = len(ci_reasoning.joinpath("data", "countdown_eval.jsonl").read_text().splitlines())
    # One backend call per budget; its completions' token counts are the method's cost.
    assert made[0].lengths == [sum(o["tokens"] for o in outcomes if o["budget"] == b)
                               for b in (2, 3)]
    for b in (2, 3):
        mine = [r for r in rows if r["budget"] == b]
        assert len(mine) == problems * b
        assert sum(r["num_tokens"] for r in mine) == made[0].lengths[(2, 3).index(b)]
        assert metrics["methods"]["independent"]["budgets"][str(b)]["tokens_mean"] == \
            pytest.approx(made[0].lengths[(2, 3).index(b)] / problems)
    assert all(o["scored_tokens"] == 0 for o in outcomes)


def test_bad_input_is_refused_before_anything_is_written(ci_testbed, ci_reasoning, tmp_path,
                                                         capsys):
    cases = [
        ([f"--model={ci_reasoning}", "--methods", "independent,beam"], "unknown test-time method"),
        ([f"--model={ci_testbed}", "--methods", "per"], "per needs facts, review, revise"),
        ([f"--model={ci_testbed}", "--methods", "base_oracle,base_select"],
         "base_select needs formalize"),
        ([f"--model={ci_reasoning}", "--budgets", "0,2"], "positive integers"),
        ([f"--model={ci_reasoning}", "--budgets", "a"], "comma-separated"),
        ([f"--model={ci_reasoning}", "--methods", "base_select", "--budgets", "1,2"],
         "base_select needs budgets of at least 2"),
        ([f"--model={ci_reasoning}", "--task", "arithmetic"], "tasks countdown, knowledge only"),
        ([f"--model={ci_reasoning}", "pairs=[base_select:beam]"], "pairs entries must be A:B"),
        ([f"--model={ci_reasoning}", "pairs=[ttel:ttel]"], "pairs entries must be A:B"),
    ]
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        assert main(["testtime", *args, "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert not out.exists()


@pytest.mark.vllm
@pytest.mark.slow
def test_testtime_with_the_vllm_backend(ci_reasoning, tmp_path):
    out = tmp_path / "tt"
    # vLLM engines share process-wide state: the run gets a process of its own.
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.run(
        [sys.executable, "-m", "es_llm", "testtime", "--model", str(ci_reasoning), "--methods",
         "independent,ttel,per", "--budgets", "2", "--limit", "5", "--backend", "vllm",
         "--out", str(out), "--no-progress", "bootstrap=20"],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["config"]["backend"] == "vllm"
    rows = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert {r["stage"] for r in rows} >= {"solve", "trajectory", "plan", "execute", "review"}
    # The testbed's tokens are characters: a sample costs its text and the EOS that ended it.
    solve = [r for r in rows if r["stage"] == "solve"]
    assert len(solve) == 10
    assert all(r["num_tokens"] == len(r["completion"]) + (r["finish_reason"] == "stop")
               for r in solve)


def test_compare_draws_test_time_curves_for_every_model(ci_testbed, ci_reasoning, tmp_path):
    out = tmp_path / "cmp"
    code = main(["compare", "--models", f"base={ci_testbed}", f"reasoning={ci_reasoning}",
                 "--n", "2", "--limit", "5", "--backend", "hf", "--out", str(out),
                 "--data", str(ci_reasoning / "data" / "countdown_eval.jsonl"),
                 "--no-progress", "--testtime-methods", "independent,base_oracle",
                 "testtime.budgets=[2]", "bootstrap=20"])
    assert code == 0
    comp = json.loads((out / "comparison.json").read_text())
    section = comp["testtime"]
    assert set(section["models"]) == {"base", "reasoning"}
    assert set(section["curves"]["covered"]["auc_log_tokens"]) == {
        "base independent", "base base_oracle", "reasoning independent",
        "reasoning base_oracle"}
    assert "## Test-time methods" in (out / "report.md").read_text()
    assert (out / "figures" / "testtime.png").is_file()
    # A method the student was not built for is refused before anything runs.
    bad = tmp_path / "bad"
    assert main(["compare", "--models", f"base={ci_testbed}", "--n", "2", "--limit", "5",
                 "--backend", "hf", "--out", str(bad), "--no-progress",
                 "--testtime-methods", "per"]) == 2
    assert not bad.exists()


def test_area_difference_is_paired_over_problems():
    from es_llm.testtime.curves import auc_difference_ci

    rng = np.random.default_rng(0)
    tokens = {"a": [np.full(20, 10.0), np.full(20, 100.0)],
              "b": [np.full(20, 10.0), np.full(20, 100.0)]}
    ones, zeros = np.ones(20), np.zeros(20)
    same = auc_difference_ci(tokens, {"a": [ones, ones], "b": [ones, ones]}, "a", "b", 10, 100,
                             rng, 50)
    assert same == {"value": 0.0, "ci95": [0.0, 0.0]}
    # a solves everything at both budgets, b nothing at the first and everything at the
    # second: b's curve is 0 on the whole range [10, 100) but the last point.
    apart = auc_difference_ci(tokens, {"a": [ones, ones], "b": [zeros, ones]}, "a", "b", 10,
                              100, rng, 50)
    assert apart["value"] == pytest.approx(1.0) and apart["ci95"] == [1.0, 1.0]


def test_reasoning_held_out_problems_are_never_trained_on():
    from dataclasses import replace

    from es_llm.testbed.config import load_testbed_config
    from es_llm.testbed.domains import example_stream, held_out

    cfg = load_testbed_config("ci")
    sets, excluded = held_out("reasoning", cfg)
    assert set(sets) == {"countdown_eval", "countdown_rl"}
    assert all(p.prompt.startswith("nums ") for split in sets.values() for p in split)
    draw = example_stream("reasoning", cfg, excluded, progress=False)
    rng = random.Random(0)
    for prompt, _ in (draw(rng) for _ in range(2000)):
        numbers, target = R.parse_problem(prompt)
        assert f"cd:{sorted(numbers)}:{target}" not in excluded
    # The reasoning section is not part of the student's fingerprint: building it never
    # changes the student or its recorded numbers.
    other = replace(cfg, reasoning=replace(cfg.reasoning, enabled=True, eval_per_tier=3))
    assert other.fingerprint() == cfg.fingerprint()
    assert other.domain_key("reasoning") != cfg.domain_key("code")


def test_role_accuracy_script(ci_reasoning, ci_testbed, tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "role_accuracy", Path(__file__).resolve().parents[1] / "scripts" / "role_accuracy.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "roles.json"
    assert script.main(["--model", str(ci_reasoning), "--limit", "8", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["problems"] == 8 and figures["review"]["traces"] == 16
    assert figures["review"]["wrong_traces"] == 8
    assert set(figures["revise"]) == {"with_step", "wrong_only", "self_repair", "clean_kept"}
    assert all(0 <= figures[r]["accuracy"] <= 1 for r in ("solve", "direct", "facts"))
    assert {k: figures["formalize"][k]["candidates"] for k in ("right", "wrong")} == \
        {"right": 8, "wrong": 8}
    for case in figures["formalize"].values():
        assert case["faithful"] <= case["parsed"] and case["checks"] <= case["parsed"]
    # The plain student has no review or revise role.
    assert script.main(["--model", str(ci_testbed), "--limit", "8"]) == 2
    assert "was built with the roles solve only" in capsys.readouterr().err


def test_every_method_on_the_success_figure_has_its_own_line_style():
    from es_llm.testtime.report import curve_styles

    styles = curve_styles(25)
    keys = [(s["color"], s["marker"], s["linestyle"]) for s in styles]
    assert len(set(keys)) == 25
    assert keys[0] == ("C0", "o", "-") and keys[10] == ("C0", "s", "--")
