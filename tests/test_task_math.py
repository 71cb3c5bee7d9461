"""Math: the six evaluation files, gold extraction, math-verify in worker processes, and
the timeout / crash handling that keeps a bad completion from hanging or killing a run."""

from __future__ import annotations

import os
import signal
import time

import pytest

from es_llm.errors import BadInput
from es_llm.tasks import Problem, TaskConfig, build_task
from es_llm.tasks.math import MathTask, gold_from_record, last_boxed, load_problems

FILES = {"math500": 500, "gsm8k": 1319, "aime24": 30, "amc23": 40, "minerva_math": 272,
         "olympiadbench": 675}


# Checkers for the worker tests. They run in a spawned worker, which imports this module
# by name to find them, so they must live at module level.

def _ok(gold: str, completion: str) -> dict:
    return {"correct": completion == gold, "answer": completion, "answer_key": completion,
            "error": None}


def _sleepy(gold: str, completion: str) -> dict:
    if "sleep" in completion:
        time.sleep(60)  # interrupted by the worker's own timer
    return _ok(gold, completion)


def _stubborn(gold: str, completion: str) -> dict:
    if "sleep" in completion:
        # Like a long C-level computation: the worker's timer cannot interrupt it, so only
        # the parent's hard kill ends it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    return _ok(gold, completion)


def _fragile(gold: str, completion: str) -> dict:
    if completion == "crash":
        os._exit(3)
    if completion == "raise":
        raise ValueError("bad input")
    return _ok(gold, completion)


def _problem(gold: str) -> Problem:
    return Problem(id="t", prompt="", gold=gold)


@pytest.fixture(scope="module")
def math500(shared_data):
    task = MathTask(TaskConfig(name="math", data=str(shared_data / "math" / "math500.jsonl")))
    yield task
    task.close()


# --- files and golds ------------------------------------------------------------------------

@pytest.mark.parametrize("name, count", FILES.items())
def test_each_file_loads(shared_data, name, count):
    problems = load_problems(shared_data / "math" / f"{name}.jsonl")
    assert len(problems) == count
    assert len({p.id for p in problems}) == count
    assert all(isinstance(p.gold, str) and p.gold.strip() for p in problems)
    assert all(p.prompt.endswith("Put your final answer within \\boxed{}.") for p in problems)


def test_gold_extraction_per_file(shared_data):
    first = {name: load_problems(shared_data / "math" / f"{name}.jsonl")[:2] for name in FILES}
    assert first["math500"][0].gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first["math500"][0].difficulty == 2  # the MATH level
    assert first["math500"][0].id == "test/precalculus/807.json"
    assert first["gsm8k"][0].gold == "18"
    assert first["aime24"][0].gold == "204"
    assert first["amc23"][0].gold == "27"  # 27.0 in the file
    assert first["minerva_math"][0].gold == "1.6"  # the last \boxed{} of the solution
    assert first["olympiadbench"][1].gold == "\\frac{1}{2 n+2}"  # "$...$" stripped
    gsm8k = load_problems(shared_data / "math" / "gsm8k.jsonl")
    assert gsm8k[146].gold == "2125"  # "#### 2,125": thousands separator removed


def test_gold_from_record_rules():
    assert gold_from_record({"answer": "Work.\n#### 1,450,000"}) == "1450000"
    assert gold_from_record({"answer": 2.5}) == "2.5"
    assert gold_from_record({"final_answer": ["$69$,$84$"]}) == "69,84"
    assert gold_from_record({"answer": "\\$18.90"}) == "\\$18.90"  # an escaped $ stays
    assert gold_from_record({"solution": "so $\\boxed{\\frac{1}{2}}$."}) == "\\frac{1}{2}"
    assert gold_from_record({"solution": "no box"}) is None


def test_last_boxed_balances_braces():
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b^{2}}}!") == "\\frac{a}{b^{2}}"
    assert last_boxed("\\boxed {x}") == "x"
    assert last_boxed("\\boxed{2} and a broken \\boxed{3") == "2"
    assert last_boxed("nothing") is None


def test_missing_gold_is_bad_input(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"problem": "1+1?", "notes": "x"}\n')
    with pytest.raises(BadInput, match="record 0 has no gold answer.*notes, problem"):
        load_problems(path)


def test_math_needs_a_file():
    with pytest.raises(BadInput, match="task.data"):
        build_task(TaskConfig(name="math"))


# --- verification ---------------------------------------------------------------------------

def test_equivalent_forms_verify(math500):
    cases = [("\\frac{1}{2}", "The answer is \\boxed{0.5}.", True),
             ("0.5", "so $\\frac{1}{2}$", True),
             ("\\frac{14}{3}", "\\boxed{\\frac{14}{3}}", True),
             ("\\frac43", "\\boxed{\\frac{4}{3}}", True),
             ("18", "I think \\boxed{17}.", False),
             ("\\frac{1}{3}", "\\boxed{0.333}", False),  # not within math-verify's rounding
             ("p - q", "\\boxed{q - p}", False)]
    scores = math500.score_many([(_problem(g), c) for g, c, _ in cases])
    assert [s.correct for s in scores] == [ok for _, _, ok in cases]
    assert [s.reward for s in scores] == [float(ok) for _, _, ok in cases]


def test_score_fields(math500):
    s = math500.score(_problem("\\frac{1}{2}"), "Work...  so\n the answer is \\boxed{\\frac{1}{2}}")
    assert (s.correct, s.format_ok, s.answer, s.answer_key, s.error) == (
        True, True, "\\frac{1}{2}", "1/2", None)
    assert s.solution_key == "Work... so the answer is \\boxed{\\frac{1}{2}}"
    none = math500.score(_problem("3"), "I do not know.")
    assert (none.reward, none.format_ok, none.answer, none.error) == (0.0, False, None,
                                                                     "no answer")


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_every_gold_verifies_against_itself(shared_data, math500, name):
    """Each gold, boxed in a completion, is judged equal to itself (no file is skipped).

    This needed math-verify's malformed-operator normalisation for predictions (MATH-500
    has golds such as \\frac43 and \\frac 59) and removing "$" delimiters from golds
    (Minerva and OlympiadBench have "$" inside answers).
    """
    problems = load_problems(shared_data / "math" / f"{name}.jsonl")
    scores = math500.score_many([(p, f"So the final answer is \\boxed{{{p.gold}}}.")
                                 for p in problems])
    failed = [(p.id, p.gold, s.error) for p, s in zip(problems, scores) if not s.correct]
    assert failed == []


def test_format_weight(shared_data):
    cfg = TaskConfig(name="math", data=str(shared_data / "math" / "aime24.jsonl"),
                     format_weight=0.2)
    with MathTask(cfg, checker=_sleepy) as task:
        wrong, right = task.score_many([(_problem("5"), "\\boxed{4}"),
                                        (_problem("\\boxed{5}"), "\\boxed{5}")])
    assert wrong.reward == pytest.approx(0.2) and right.reward == pytest.approx(1.0)


# --- timeouts, crashes, exceptions ----------------------------------------------------------

def _task(shared_data, timeout_s: float, checker=None) -> MathTask:
    cfg = TaskConfig(name="math", data=str(shared_data / "math" / "aime24.jsonl"),
                     timeout_s=timeout_s, format_weight=0.5)
    return MathTask(cfg, checker=checker, grace_s=0.5)


def test_worker_timer_times_out_one_item(shared_data):
    with _task(shared_data, 0.3, _sleepy) as task:
        p = _problem("\\boxed{x}")
        t0 = time.monotonic()
        scores = task.score_many([(p, "\\boxed{x}"), (p, "\\boxed{sleep}"), (p, "\\boxed{x}")])
        assert time.monotonic() - t0 < 20
        assert [s.error for s in scores] == [None, "timeout", None]
        # A failed check earns nothing, not even the format share (format_weight 0.5).
        assert [s.reward for s in scores] == [1.0, 0.0, 1.0]


def test_parent_kills_a_stuck_worker_and_carries_on(shared_data):
    with _task(shared_data, 0.3, _stubborn) as task:
        p = _problem("x")
        scores = task.score_many([(p, "x"), (p, "sleep"), (p, "x"), (p, "y")])
        assert [s.error for s in scores] == [None, "timeout", None, None]
        assert [s.correct for s in scores] == [True, False, True, False]
        assert task.score(p, "x").correct  # the next call works too


def test_crash_and_exception_give_reward_zero(shared_data):
    with _task(shared_data, 5.0, _fragile) as task:
        p = _problem("x")
        scores = task.score_many([(p, "crash"), (p, "x"), (p, "raise"), (p, "x")])
        assert scores[0].error == "worker crashed (exit code 3)"
        assert scores[2].error == "ValueError: bad input"
        assert [s.correct for s in scores] == [False, True, False, True]
        assert [s.reward for s in scores] == [0.0, 0.5, 0.0, 0.5]  # correct, but no boxed answer


def test_real_heavy_input_times_out(shared_data):
    # 9^(9^(9^9)) makes sympy compute a gigantic power when compared with 5.
    with _task(shared_data, 1.0) as task:
        p = _problem("5")
        t0 = time.monotonic()
        heavy = task.score(p, "the answer is \\boxed{9^{9^{9^{9}}}}")
        assert (heavy.reward, heavy.correct, heavy.error) == (0.0, False, "timeout")
        assert time.monotonic() - t0 < 30
        assert task.score(p, "\\boxed{5}").correct
