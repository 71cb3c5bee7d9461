"""TTEL and DART as their sources define them, on hand-built examples and scripted models:
TTEL's feedback and null contexts differ in the critique line only, its threshold picks the
earliest passing segment, sequential branching re-localises every rejected branch; DART's
budget map is fitted on solved calibration problems only, its routing and token statistics
by hand, and bad input (a threshold outside [0, inf), no solved calibration problem) exits 2
before anything is written."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from es_llm.cli import main
from es_llm.errors import BadInput
from es_llm.tasks import Problem, countdown
from es_llm.tasks.countdown_roles import answer_value
from es_llm.testtime import run as testtime_run
from es_llm.testtime.dart import _dart_calibrate, dart_stats, solved_points, truncated_share
from es_llm.testtime.generations import Gen
from es_llm.testtime.methods import METHODS, MethodInput, TestTimeSettings
from es_llm.testtime.ttel import contexts, error_segment, pick_segment

PROBLEM = Problem(id="p", prompt="nums 7 3 4 make 25\n", gold={"numbers": [7, 3, 4], "target": 25})


def gen_of(text: str, problem: Problem = PROBLEM, finish: str = "stop",
           logprobs: tuple[float, ...] | None = None) -> Gen:
    """A completion as ``Generations.draw`` makes it: one token per character."""
    numbers, target = problem.gold["numbers"], problem.gold["target"]
    score = countdown.score_completion(numbers, target, text)
    return Gen(text=text, num_tokens=len(text), logprobs=logprobs, finish_reason=finish,
               correct=bool(score.correct), value=answer_value(numbers, text),
               answer=score.answer)


# --------------------------------------------------------------------------------------------
# TTEL
# --------------------------------------------------------------------------------------------

def test_ttel_contexts_differ_only_in_the_critique_line():
    trace = "7*3=21 21+5=26 <answer>7*3+5</answer>"
    feedback, null = contexts(PROBLEM, trace)
    assert feedback == f"revise nums 7 3 4 make 25\n{trace}\nwrong\n"
    assert null == f"revise nums 7 3 4 make 25\n{trace}\ncheck\n"
    differ = [i for i, (a, b) in enumerate(zip(feedback.split("\n"), null.split("\n"))) if a != b]
    assert differ == [2] and len(feedback.split("\n")) == len(null.split("\n"))


def test_the_threshold_picks_the_earliest_passing_segment():
    gaps = [0.2, 1.5, None, 3.0, 1.2]
    assert pick_segment(gaps) == 3  # off: the largest gap
    assert pick_segment(gaps, 1.0) == 1  # the earliest reaching 1.0, not the largest
    assert pick_segment(gaps, 1.5) == 1  # reaching counts
    assert pick_segment(gaps, 2.0) == 3
    assert pick_segment(gaps, 9.0) == 3  # none reaches it: the largest gap
    assert pick_segment([None, 2.0, 2.0]) == 1  # ties to the earliest; no token, no win
    assert pick_segment([None, None], 1.0) == 0
    # Through the token gaps: tokens 0-5 in the first span, 7-13 in the second.
    gap_T = np.array([0.0, 1.1, 0, 0, 0, 0, 0, 0, 0, 4.0, 0, 0, 0, 0])
    spans = [(0, 6), (7, 14)]
    assert error_segment(spans, gap_T, list(range(14))) == 1
    assert error_segment(spans, gap_T, list(range(14)), threshold=1.0) == 0


# The scripted model: each trajectory's wrong segment costs -6 per character under the
# feedback context only; every other token costs -0.1 under both.
WRONG = ("21+5=26", "<answer>7*3-4</answer>")
# Continuations by kept prefix, in the order they are drawn.
SCRIPT = {"": ["7*3=21 21+5=26 <answer>7*3+5</answer>"],
          "7*3=21 ": ["21+4=25 <answer>7*3-4</answer>", "21+4=25 <answer>7*3+4</answer>"],
          "7*3=21 21+4=25 ": ["<answer>7*3+4</answer>"]}


class _ScriptedGen:
    """A ``Generations`` stand-in: draws follow ``SCRIPT``, scoring follows ``WRONG``; the
    stages drawn and the traces localised are recorded."""

    def __init__(self):
        from es_llm.testbed.tokenizer import build_tokenizer

        self.scorer = SimpleNamespace(tokenizer=build_tokenizer())
        self.stages, self.localized, self._next = [], [], {}

    def score_tokens(self, label, jobs):
        out = []
        for _, ctx, text in jobs:
            lps = [-0.1] * len(text)
            if ctx.endswith("\nwrong\n"):
                self.localized.append(text)
                for w in WRONG:
                    if w in text:
                        at = text.index(w)
                        lps[at:at + len(w)] = [-6.0] * len(w)
            out.append(lps)
        return out

    def draw(self, label, stage, jobs, n, max_tokens, prefixes=None, **_):
        self.stages.append(stage)
        heads = prefixes or [""] * len(jobs)
        out = []
        for (p, _), head in zip(jobs, heads):
            gens = []
            for _ in range(n):
                i = self._next.get(head, 0)
                self._next[head] = i + 1
                gens.append(gen_of(head + SCRIPT[head][i % len(SCRIPT[head])], p))
            out.append(gens)
        return out


def _run_ttel(branching: str, budget: int):
    gen = _ScriptedGen()
    cfg = TestTimeSettings(ttel_branching=branching)
    result = METHODS.get("ttel").run(MethodInput(("ttel", budget), [PROBLEM], budget, gen, cfg))
    return gen, result


def test_sequential_branching_relocalizes_each_rejected_branch():
    gen, result = _run_ttel("sequential", budget=4)
    # Round 1 cuts before step 2; its branch ends on the wrong answer, so round 2 localises
    # that branch afresh, cuts before its answer, and the branch it draws is accepted: two
    # branches of the four allowed.
    assert gen.localized == ["7*3=21 21+5=26 <answer>7*3+5</answer>",
                             "7*3=21 21+4=25 <answer>7*3-4</answer>"]
    assert gen.stages == ["trajectory", "branch-1", "branch-2"]
    row = result.outcomes[0]
    assert row["error_segment"] == 2 and row["verifier_step"] == 2 and row["localizations"] == 2
    # The checker takes the accepted branch; the vote of the two (one each) takes the first.
    assert row["covered"] and row["answered_by_checker"] and not row["answered"]
    assert result.stats["answered_by_checker"] == 1.0 and result.stats["answered_by_vote"] == 0.0
    assert result.stats["localizations_per_failure"] == 2.0


def test_parallel_branching_localizes_once():
    gen, result = _run_ttel("parallel", budget=2)
    assert gen.localized == ["7*3=21 21+5=26 <answer>7*3+5</answer>"]
    assert gen.stages == ["trajectory", "branch"]
    row = result.outcomes[0]
    assert row["localizations"] == 1 and row["covered"] and row["answered_by_checker"]


# --------------------------------------------------------------------------------------------
# DART
# --------------------------------------------------------------------------------------------

RIGHT, WRONG_ANSWER = "<answer>7*3+4</answer>", "<answer>7*3-4</answer>"


def test_dart_fit_ignores_unsolved_calibration_problems():
    solves = [[gen_of(WRONG_ANSWER), gen_of(WRONG_ANSWER)],                       # unsolved
              [gen_of("7*3=21 21+4=25 " + RIGHT), gen_of(RIGHT), gen_of(WRONG_ANSWER)],
              [gen_of("7*3=21 21+4=25 " + RIGHT)]]
    x, y = solved_points([0.5, 1.0, 2.0], solves)
    assert x.tolist() == [1.0, 2.0] and y.tolist() == [len(RIGHT), len(RIGHT) + 15]
    assert solved_points([0.5], solves[:1])[0].size == 0


class _CalibrationGen:
    """Draws for ``_dart_calibrate``: drafts with per-problem logprobs, solves from a list."""

    def __init__(self, surprisal: dict[str, float], solves: dict[str, list[str]]):
        self.surprisal, self.solves = surprisal, solves

    def draw(self, label, stage, jobs, n, max_tokens, **_):
        if stage == "draft":
            return [[gen_of(RIGHT, p, logprobs=(-self.surprisal[p.id],))] * n for p, _ in jobs]
        return [[gen_of(t, p) for t in self.solves[p.id]] for p, _ in jobs]

    def cost(self, label, problem_id):
        return 0, 0


def test_dart_calibration_fits_on_solved_problems_and_refuses_none():
    problems = [Problem(id=i, prompt=PROBLEM.prompt, gold=PROBLEM.gold) for i in "abc"]
    solves = {"a": [WRONG_ANSWER], "b": [RIGHT], "c": ["7*3=21 21+4=25 " + RIGHT]}
    gen = _CalibrationGen({"a": 0.5, "b": 1.0, "c": 2.0}, solves)
    cal = _dart_calibrate(gen, TestTimeSettings(calibration_samples=1), problems)
    # The unsolved problem (lowest entropy) would have pinned the map at max_tokens there.
    assert cal["knots_entropy"] == [1.0, 2.0] and cal["solved"] == 2 and cal["problems"] == 3
    assert cal["knots_tokens"] == [len(RIGHT), len(RIGHT) + 15]
    gen.solves = {k: [WRONG_ANSWER] for k in solves}
    with pytest.raises(BadInput, match="no solved calibration problem"):
        _dart_calibrate(gen, TestTimeSettings(calibration_samples=1), problems)


def test_dart_stats_by_hand():
    rows = [dict(routed=True, draft_correct=True, answered=True, draft_tokens=10, think_tokens=0),
            dict(routed=True, draft_correct=False, answered=False, draft_tokens=12,
                 think_tokens=0),
            dict(routed=False, draft_correct=False, answered=True, draft_tokens=14,
                 think_tokens=60, think_budget=40),
            dict(routed=False, draft_correct=True, answered=False, draft_tokens=8,
                 think_tokens=30, think_budget=20)]
    thoughts = [Gen("", 40, None, "length", False, None), Gen("", 20, None, "stop", True, None),
                Gen("", 20, None, "length", False, None), Gen("", 10, None, "stop", False, None)]
    s = dart_stats(rows, thoughts, (8, 15, 32))
    assert s["route_rate"] == 0.5 and s["agreement_precision"] == 0.5
    # Right to route the correct draft (first) and to think on the wrong one (third).
    assert s["routing_accuracy"] == 0.5
    assert s["draft_tokens_mean"] == 11.0 and s["think_tokens_mean"] == 22.5
    assert s["mean_think_budget"] == 30.0 and s["thinking_samples"] == 4
    assert s["truncated_share"] == 0.5
    # Cap 15 also cuts the 20-token sample that ended by itself; cap 32 cuts nothing more.
    assert s["truncated_share_at_cap"] == {"8": 1.0, "15": 0.75, "32": 0.5}
    assert truncated_share([]) is None


class _TableGen:
    """Draws read from a table by (stage, problem id); the token caps asked for recorded."""

    def __init__(self, table: dict):
        self.table, self.caps = table, {}

    def draw(self, label, stage, jobs, n, max_tokens, **_):
        self.caps[stage] = max_tokens
        return [[gen_of(t, p, logprobs=(-1.0,)) for t in self.table[(stage, p.id)][:n]]
                for p, _ in jobs]


def test_dart_routes_agreeing_drafts_and_thinks_within_the_budget():
    a, b = (Problem(id=i, prompt=PROBLEM.prompt, gold=PROBLEM.gold) for i in "ab")
    gen = _TableGen({("draft", "a"): [RIGHT, RIGHT], ("draft", "b"): [RIGHT, WRONG_ANSWER],
                     ("think", "b"): [WRONG_ANSWER, RIGHT, RIGHT]})
    # A flat map at 20 tokens: budget 20 * (1 + 0.2) = 24 for every disagreement.
    cal = {"knots_entropy": [0.0, 2.0], "knots_tokens": [20.0, 20.0]}
    result = METHODS.get("dart").run(MethodInput(("dart", 3), [a, b], 3, gen,
                                                 TestTimeSettings(dart_caps=(21, 30)), cal))
    ra, rb = result.outcomes
    assert ra["routed"] and ra["answered"] and ra["think_tokens"] == 0
    assert ra["draft_tokens"] == 2 * len(RIGHT)
    assert not rb["routed"] and rb["think_budget"] == 24 and gen.caps["think"] == 24
    assert rb["answered"] and rb["think_tokens"] == 3 * len(RIGHT)
    s = result.stats
    # b's first draft was right, so sending it on to thinking was a routing error.
    assert s["route_rate"] == 0.5 and s["routing_accuracy"] == 0.5
    assert s["agreement_precision"] == 1.0 and s["mean_think_budget"] == 24.0
    # Three 22-token thoughts that ended by themselves: cap 21 would have cut them all.
    assert s["truncated_share"] == 0.0 and s["truncated_share_at_cap"] == {"21": 1.0, "30": 0.0}


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ("-1", "testtime.ttel_threshold must lie in [0, inf)"),
    ("-0.5", "testtime.ttel_threshold must lie in [0, inf)"),
    (".inf", "'testtime.ttel_threshold' must be a finite number")])
def test_a_threshold_outside_zero_to_infinity_exits_2(tmp_path, capsys, value, message):
    out = tmp_path / "out"
    assert main(["testtime", "--model", str(tmp_path / "model"), "--out", str(out),
                 "--no-progress", f"testtime.ttel_threshold={value}"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    # The settings refuse it themselves, whoever builds them.
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(BadInput, match=r"\[0, inf\)"):
            TestTimeSettings(ttel_threshold=bad)


class _NeverSolves:
    """A backend whose every completion is a wrong answer."""

    name = "hf"

    def generate(self, prompts, params, progress=False, keys=None):
        from es_llm.backends.base import Completion

        text = WRONG_ANSWER
        return [[Completion(text, tuple(range(len(text))), (-1.0,) * len(text), "stop")] * params.n
                for _ in prompts]

    def close(self):
        pass


def test_no_solved_calibration_problem_exits_2_and_writes_nothing(tmp_path, capsys,
                                                                  monkeypatch):
    data = tmp_path / "problems.jsonl"
    data.write_text('{"id": "e0", "numbers": [7, 3, 4], "target": 25}\n')
    problems = [PROBLEM]
    calibration = [Problem(id="c0", prompt=PROBLEM.prompt, gold=PROBLEM.gold)]
    monkeypatch.setattr(testtime_run, "check_model_path", lambda path: None)
    monkeypatch.setattr(testtime_run, "check_roles", lambda folder, needs: None)
    task = testtime_run.build_task(testtime_run.TaskConfig(name="countdown", data=str(data)))
    monkeypatch.setattr(testtime_run, "_problems", lambda cfg: (task, problems, calibration))
    monkeypatch.setattr(testtime_run, "make_backend", lambda spec: _NeverSolves())
    out = tmp_path / "out"
    assert main(["testtime", "--model", str(tmp_path), "--methods", "dart", "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no solved calibration problem" in err and "testtime.calibration_data" in err
    assert not out.exists()
