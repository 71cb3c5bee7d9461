"""Arithmetic: hand-checked traces, the integer verifier, the generator and file loading."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from es_llm.errors import BadInput
from es_llm.tasks import TaskConfig, build_task
from es_llm.tasks.arithmetic import (generate, load_problems, render_prompt, score_completion,
                                     solve_with_trace)


@pytest.mark.parametrize("operands, ops, value, steps", [
    ([3, 4, 5, 2], "+*-", 21, ["4*5=20", "3+20=23", "23-2=21"]),
    ([3, 4, 5], "-*", -17, ["4*5=20", "3-20=-17"]),
    ([2, 3, 4, 5], "*-*", -14, ["2*3=6", "4*5=20", "6-20=-14"]),
    ([9, 0, 7], "*+", 7, ["9*0=0", "0+7=7"]),
    ([8, 5, 1, 6], "-+-", -2, ["8-5=3", "3+1=4", "4-6=-2"]),
])
def test_trace_by_hand(operands, ops, value, steps):
    assert solve_with_trace(operands, list(ops)) == (value, steps)


def test_prompt_format():
    assert render_prompt("3+4*5-2") == "calc 3+4*5-2\n"


@pytest.mark.parametrize("completion, correct, format_ok, answer", [
    ("4*5=20 3+20=23 23-2=21 <answer>21</answer>", True, True, "21"),
    ("<answer> 21 </answer>", True, True, "21"),
    ("<answer>20</answer> <answer>21</answer>", True, True, "21"),   # the last block wins
    ("so it is 21", True, False, "21"),                               # no tags: last integer
    ("23-2", False, False, "2"),          # "-2" glued to a digit is an operator, not a sign
    ("<answer>22</answer>", False, True, "22"),
])
def test_scores(completion, correct, format_ok, answer):
    s = score_completion(21, completion)
    assert (s.correct, s.format_ok, s.answer, s.reward) == (correct, format_ok, answer,
                                                            float(correct))


def test_negative_answers_and_errors():
    assert score_completion(-17, "4*5=20 3-20=-17 <answer>-17</answer>").correct
    assert score_completion(-17, "3-20 gives -17").correct
    assert score_completion(5, "<answer>five</answer>").error == "answer is not an integer"
    assert score_completion(5, "<answer>5.0</answer>").error == "answer is not an integer"
    assert score_completion(5, "no digits here").error == "no answer"
    s = score_completion(5, "<answer>" + "9" * 5000 + "</answer>")
    assert s.reward == 0.0 and s.error.startswith("answer too long")
    assert score_completion(5, "<answer>4</answer>", format_weight=0.25).reward == 0.25
    # require_answer_tag: the last integer outside tags no longer counts.
    assert score_completion(-17, "3-20 gives -17", require_answer_tag=True).error == "no answer"
    assert score_completion(-17, "<answer>-17</answer>", require_answer_tag=True).correct


def test_generate_is_deterministic():
    a = [generate(random.Random(11), n) for n in (2, 3, 4, 5)]
    b = [generate(random.Random(11), n) for n in (2, 3, 4, 5)]
    assert a == b


@pytest.mark.parametrize("tier", [2, 3, 4, 5, 6])
def test_generated_traces_score_one(tier):
    rng = random.Random(100 + tier)
    for _ in range(100):
        problem, completion = generate(rng, tier)
        match = re.fullmatch(r"calc ([0-9]([-+*][0-9])*)\n", problem.prompt)
        assert match and len(re.findall(r"[0-9]", match.group(1))) == tier
        assert problem.difficulty == tier
        assert score_completion(problem.gold, completion).reward == 1.0
        assert len(completion.split(" <answer>")[0].split(" ")) == tier - 1


def test_procedural_task_covers_default_tiers():
    problems = build_task(TaskConfig(name="arithmetic", seed=1)).problems()
    assert problems == build_task(TaskConfig(name="arithmetic", seed=1)).problems()
    assert len({p.prompt for p in problems}) == 200
    assert Counter(p.difficulty for p in problems) == {2: 50, 3: 50, 4: 50, 5: 50}


def test_exhausted_tier_raises_instead_of_looping():
    # Two operands 0..9 and three operators make only 300 distinct problems.
    with pytest.raises(BadInput, match="tier 2 ran out"):
        build_task(TaskConfig(name="arithmetic", tiers=(2,), num_problems=400)).problems()


def test_load_jsonl(tmp_path):
    path = tmp_path / "ar.jsonl"
    rows = [{"id": "x1", "prompt": "calc 3+4*5-2\n", "answer": 21, "difficulty": 4},
            {"id": "x2", "prompt": "calc 3-4*5\n", "answer": "-17"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task(TaskConfig(name="arithmetic", data=str(path)))
    p1, p2 = task.problems()
    assert (p1.id, p1.gold, p1.difficulty) == ("x1", 21, 4)
    assert (p2.gold, p2.difficulty) == (-17, 0)
    scores = task.score_many([(p1, "<answer>21</answer>"), (p2, "<answer>17</answer>")])
    assert [s.correct for s in scores] == [True, False]


def test_non_integer_answer_in_file_is_bad_input(tmp_path):
    path = tmp_path / "ar.jsonl"
    path.write_text(json.dumps({"prompt": "calc 1/2\n", "answer": 0.5}) + "\n")
    with pytest.raises(BadInput, match="record 0 has answer 0.5"):
        load_problems(path)
