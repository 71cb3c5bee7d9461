"""Countdown: the AST verifier (correctness and refusal of anything but + - * / on the given
numbers), the generator and its worked traces, and the ES-paper countdown.json."""

from __future__ import annotations

import builtins
import json
import random
import re
import time
from collections import Counter

import pytest

from es_llm.errors import BadInput
from es_llm.tasks import TaskConfig, build_task
from es_llm.tasks import countdown
from es_llm.tasks.countdown import (CountdownTask, generate, parse_expression, render,
                                    render_prompt, score_completion, solution_key)


def _score(numbers, target, completion, **kw):
    return score_completion(numbers, target, completion, **kw)


# --- correct and incorrect answers ------------------------------------------------------------

@pytest.mark.parametrize("numbers, target, completion", [
    ([7, 3, 4], 25, "7*3=21 21+4=25 <answer>7*3+4</answer>"),
    # 6/3 = 2 exactly, then 2*4 = 8.
    ([3, 4, 6], 8, "<answer>6/3*4</answer>"),
    # 3/6 = 1/2 is not an integer mid-way; 4/(1/2) = 8 exactly with Fractions.
    ([3, 4, 6], 8, "<answer>4/(3/6)</answer>"),
    # Intermediates may go negative: (2-5) * (1-4) = (-3)*(-3) = 9.
    ([1, 2, 4, 5], 9, "<answer>(2-5)*(1-4)</answer>"),
    ([44, 19, 35], 98, "<think>...</think>\n<answer> ((44 + 19) + 35) </answer>"),
    # Line breaks inside parentheses are fine.
    ([10, 2, 3], 4, "<answer>(10+2\n)/3</answer>"),
])
def test_correct_answers_score_one(numbers, target, completion):
    s = _score(numbers, target, completion)
    assert (s.reward, s.correct, s.format_ok, s.error) == (1.0, True, True, None)


def test_last_answer_block_wins_and_keys_are_canonical():
    s = _score([7, 3, 4], 25, "<answer>7+3+4</answer> no wait <answer>((7*3))+4</answer>")
    assert s.correct and s.answer == "((7*3))+4"
    assert s.answer_key == "7*3+4"  # re-rendered with parentheses only where needed


def test_solution_key_groups_rearrangements_only():
    key = lambda e: solution_key(parse_expression(e))  # noqa: E731
    assert key("3+4") == key("4+3") == key("(4+3)")
    assert key("7*3+4") == key("4+3*7") == key("4+(7*3)")
    assert key("9-(5-2)") == key("9+2-5") == key("2-5+9")
    assert key("8/(4/2)") == key("8*2/4")
    assert key("7*3+4") != key("7*(3+4)")
    assert key("9-5-2") != key("9-(5-2)")


def test_render_uses_minimal_parentheses():
    assert render(("-", 9, ("-", 5, 2))) == "9-(5-2)"
    assert render(("-", ("-", 9, 5), 2)) == "9-5-2"
    # a*(b/c) equals (a*b)/c exactly, so it needs no parentheses; a/(b*c) does.
    assert render(("*", ("+", 1, 2), ("/", 6, 3))) == "(1+2)*6/3"
    assert render(("/", 6, ("*", 2, 3))) == "6/(2*3)"
    assert render(("+", ("*", 1, 2), ("+", 6, 3))) == "1*2+6+3"


def test_wrong_value_scores_zero_without_error():
    s = _score([7, 3, 4], 25, "<answer>7*3-4</answer>")
    assert (s.reward, s.correct, s.error, s.answer_key) == (0.0, False, None, "7*3-4")


@pytest.mark.parametrize("answer, error", [
    ("7*3+7", "numbers used [3, 7, 7] but given [3, 4, 7]"),   # 7 reused (and = 28, not 25)
    ("7*3", "numbers used [3, 7] but given [3, 4, 7]"),         # 4 missing
    ("7*3+4+4-4", "numbers used [3, 4, 4, 4, 7] but given [3, 4, 7]"),  # right value, extra 4s
])
def test_numbers_must_be_used_exactly_once(answer, error):
    s = _score([7, 3, 4], 25, f"<answer>{answer}</answer>")
    assert (s.reward, s.correct, s.error) == (0.0, False, error)


def test_division_by_zero_is_an_error_not_an_exception():
    s = _score([4, 4, 2], 2, "<answer>2/(4-4)</answer>")
    assert (s.reward, s.error) == (0.0, "division by zero")


def test_missing_tags_fall_back_to_last_line_without_format_credit():
    s = _score([7, 3, 4], 25, "7*3=21 21+4=25\n7*3+4\n\n")
    assert s.correct and not s.format_ok and s.reward == 1.0
    s = _score([7, 3, 4], 25, "7*3=21 21+4=25\n7*3+4", format_weight=0.1)
    assert s.reward == pytest.approx(0.9)
    # A truncated answer tag still yields the expression.
    assert _score([7, 3, 4], 25, "7*3=21 <answer>7*3+4").correct
    assert _score([7, 3, 4], 25, "").error == "no answer"
    assert _score([7, 3, 4], 25, "<answer> </answer>").error.startswith("unparseable")


def test_format_weight_mixes_format_and_correctness():
    wrong = _score([7, 3, 4], 25, "<answer>7*3-4</answer>", format_weight=0.1)
    right = _score([7, 3, 4], 25, "<answer>7*3+4</answer>", format_weight=0.1)
    assert wrong.reward == pytest.approx(0.1) and right.reward == pytest.approx(1.0)


# --- refusal of everything else, quickly and without evaluation -------------------------------

MALICIOUS = [
    ("44**19**35", [44, 19, 35], "disallowed syntax: Pow"),
    ("2**999999", [2, 999999], "disallowed syntax: Pow"),
    ("__import__('os').system('x')", [1], "disallowed characters"),
    ("(lambda: 1)()", [1], "disallowed characters"),
    ("a+b", [1, 2], "disallowed characters"),
    ("1e9", [1, 9], "disallowed characters: 'e'"),
    ("3.5+1", [3, 5, 1], "disallowed characters: '.'"),
    ("-3+4", [3, 4], "disallowed syntax: UnaryOp"),
    ("1//2", [1, 2], "disallowed syntax: FloorDiv"),
    ("9" * 400, [int("9" * 400)], "answer too long"),
    ("(" * 1000 + "1" + ")" * 1000, [1], "answer too long"),
    ("[1,2]", [1, 2], "disallowed characters"),
    ("True+1", [1], "disallowed characters"),
    ("1234567+1", [1234567, 1], "literal too long"),
    ("7%3", [7, 3], "disallowed characters: '%'"),
    ("(1)(2)", [1, 2], "disallowed syntax: Call"),
    ("1 2", [1, 2], "unparseable"),
]


@pytest.mark.parametrize("answer, numbers, error", MALICIOUS)
def test_malicious_answers_are_rejected_fast(answer, numbers, error, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the verifier must never evaluate model text")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    t0 = time.perf_counter()
    s = _score(numbers, 5, f"<answer>{answer}</answer>")
    # A hang guard, not a benchmark: evaluating 44**19**35 would never return.
    assert time.perf_counter() - t0 < 2.0
    assert (s.reward, s.correct) == (0.0, False)
    assert s.error.startswith(error), s.error


def test_parser_limits_are_caught_not_raised():
    # Past the length cap, deep nesting makes the parser itself fail; that is a rejection.
    deep = "(" * 1000 + "1" + ")" * 1000
    with pytest.raises(countdown._Rejected, match="unparseable"):
        parse_expression(deep, max_chars=10**6)
    # Nesting within the cap parses fine: 120 levels around a single number.
    assert _score([1], 1, "<answer>" + "(" * 120 + "1" + ")" * 120 + "</answer>").correct


def test_non_decimal_literals_are_refused():
    assert _score([31, 1], 32, "<answer>0x1f+1</answer>").error.startswith("disallowed")
    assert _score([10, 1], 11, "<answer>1_0+1</answer>").error.startswith("disallowed")


# --- generation -----------------------------------------------------------------------------

def test_render_prompt_format():
    assert render_prompt([7, 3, 4], 25) == "nums 7 3 4 make 25\n"


def test_generate_is_deterministic_for_a_seed():
    a = [generate(random.Random(7), tier) for tier in (2, 3, 4)]
    b = [generate(random.Random(7), tier) for tier in (2, 3, 4)]
    assert a == b
    assert [generate(random.Random(8), 4)] != [a[2]]


@pytest.mark.parametrize("tier", [2, 3, 4, 5])
def test_generated_traces_score_one_and_respect_ranges(tier):
    rng = random.Random(tier)
    for _ in range(100):
        problem, completion = generate(rng, tier, max_target=99)
        numbers, target = problem.gold["numbers"], problem.gold["target"]
        assert problem.difficulty == tier == len(numbers)
        assert 1 <= target <= 99 and all(1 <= n <= 3 * tier + 3 for n in numbers)
        assert problem.prompt == render_prompt(numbers, target)
        assert score_completion(numbers, target, completion).reward == 1.0
        steps = completion.split(" <answer>")[0].split(" ")
        assert len(steps) == tier - 1
        for step in steps:  # every step "a op b=c" is exact and stays positive
            a, op, b, c = re.fullmatch(r"(\d+)([-+*/])(\d+)=(\d+)", step).groups()
            a, b, c = int(a), int(b), int(c)
            assert c > 0 and {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op] == c
        assert steps[-1].endswith(f"={target}")


def test_generate_accepts_a_number_range():
    rng = random.Random(0)
    for _ in range(50):
        problem, _ = generate(rng, 3, min_number=10, max_number=20, max_target=50)
        assert all(10 <= n <= 20 for n in problem.gold["numbers"])
        assert 1 <= problem.gold["target"] <= 50


def test_procedural_task_is_deterministic_distinct_and_covers_tiers():
    problems = build_task(TaskConfig(name="countdown", seed=3)).problems()
    again = build_task(TaskConfig(name="countdown", seed=3)).problems()
    other = build_task(TaskConfig(name="countdown", seed=4)).problems()
    assert problems == again and problems != other
    assert len(problems) == 200 and len({p.id for p in problems}) == 200
    keys = {(tuple(sorted(p.gold["numbers"])), p.gold["target"]) for p in problems}
    assert len(keys) == 200
    assert Counter(p.difficulty for p in problems) == {2: 67, 3: 67, 4: 66}
    assert all(re.fullmatch(r"nums( \d+)+ make \d+\n", p.prompt) for p in problems)
    limited = build_task(TaskConfig(name="countdown", seed=3, limit=10)).problems()
    assert limited == problems[:10]
    solved = [score_completion(p.gold["numbers"], p.gold["target"],
                               f"<answer>{p.meta['solution']}</answer>") for p in problems]
    assert all(s.correct for s in solved)


def test_tiers_are_checked():
    with pytest.raises(BadInput, match="tiers"):
        build_task(TaskConfig(name="countdown", tiers=(1, 3)))
    task = build_task(TaskConfig(name="countdown", tiers=(5,), num_problems=10))
    assert {p.difficulty for p in task.problems()} == {5}


# --- files ----------------------------------------------------------------------------------

def test_es_paper_countdown_json(shared_data):
    path = shared_data / "countdown" / "countdown.json"
    task = build_task(TaskConfig(name="countdown", data=str(path)))
    problems = task.problems()
    assert len(problems) == 2200
    assert Counter(p.difficulty for p in problems) == {3: 1071, 4: 1129}
    first = problems[0]
    assert first.id == "0" and first.gold == {"numbers": [44, 19, 35], "target": 98}
    assert first.prompt.startswith("You are a helpful assistant.")
    # 43 targets are rounded decimals of a division (e.g. "27.4"), matched within 1e-5.
    assert sum(isinstance(p.gold["target"], float) for p in problems) == 43
    with_solution = [p for p in problems if "solution" in p.meta]
    scores = task.score_many([(p, f"<answer>{p.meta['solution']}</answer>")
                              for p in with_solution])
    # What the file holds: 19 items have no solution (null); of the 2181 given solutions
    # 2166 are valid and 15 reuse one number in place of another (e.g. id 429:
    # "((64 - 77) + (64 + 76))" for numbers [38, 77, 64, 76]).
    assert len(with_solution) == 2181
    assert sum(s.reward == 1.0 for s in scores) == 2166
    invalid = [s for s in scores if s.reward != 1.0]
    assert len(invalid) == 15 and all(s.error.startswith("numbers used") for s in invalid)


def test_project_jsonl_and_string_targets(tmp_path):
    path = tmp_path / "cd.jsonl"
    rows = [{"id": "a", "prompt": "nums 7 3 4 make 25\n", "numbers": [7, 3, 4], "target": 25,
             "difficulty": 3},
            {"id": "b", "prompt": "nums 6 2 make 3\n", "numbers": [6, 2], "target": 3,
             "difficulty": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task(TaskConfig(name="countdown", data=str(path)))
    a, b = task.problems()
    assert (a.id, a.gold, a.difficulty, a.prompt) == ("a", {"numbers": [7, 3, 4], "target": 25},
                                                      3, "nums 7 3 4 make 25\n")
    assert task.score(b, "<answer>6/2</answer>").correct
    # No prompt field and a string target: the compact prompt is rendered.
    path2 = tmp_path / "cd2.jsonl"
    path2.write_text(json.dumps({"numbers": [6, 2], "target": "3"}) + "\n")
    (p,) = countdown.load_problems(path2)
    assert (p.id, p.prompt, p.gold["target"], p.difficulty) == ("0", "nums 6 2 make 3\n", 3, 2)


def test_bad_target_names_the_record(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"numbers": [6, 2], "target": "three"}) + "\n")
    with pytest.raises(BadInput, match="record 0 has target 'three'"):
        countdown.load_problems(path)


def test_task_interface(tmp_path):
    with CountdownTask(TaskConfig(name="countdown", num_problems=5)) as task:
        (p, *_) = task.problems()
        scores = task.score_many([(p, "<answer>" + p.meta["solution"] + "</answer>"),
                                  (p, "nonsense")])
        assert [s.reward for s in scores] == [1.0, 0.0]
        assert task.name == "countdown"


# --- hostile completions: linear answer extraction, bounded length -------------------------

def test_answer_blocks_are_the_regex_blocks():
    from es_llm.tasks.base import answer_blocks

    rng = random.Random(0)
    pieces = ["<answer>", "</answer>", "x", "7", "<", "answer", ">", "/", "\n", " "]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 14)))
        assert answer_blocks(text) == re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL), text


@pytest.mark.parametrize("task", ["countdown", "arithmetic"])
def test_many_unclosed_answer_tags_are_scored_in_linear_time(task):
    from es_llm.tasks import arithmetic

    score = (lambda c, **kw: score_completion([7, 3, 4], 25, c, **kw)) if task == "countdown" \
        else (lambda c, **kw: arithmetic.score_completion(21, c, **kw))
    # 10,000 openings and no closing tag took 27 s with the regex (each opening scanned to
    # the end); 1 MB never finished. The bound refuses both before any parsing...
    assert score("<answer>" * 10_000).error.startswith("completion too long")
    # ...and without the bound the linear scan still answers at once (a hang guard).
    t0 = time.perf_counter()
    s = score("<answer>" * 125_000, max_completion_chars=10 ** 7)
    assert time.perf_counter() - t0 < 5.0
    assert (s.reward, s.correct) == (0.0, False)


# What the ES paper's answer_reward (countdown/countdown_task.py of the paper's code) gives,
# worked out by hand from its rules: the last closed block, whose raw text must match
# ^[0-9+\-*/() ]+$ ("$" also before one final newline), the numbers used once each, and the
# value within 1e-5 of the target. Numbers [7, 3, 4], target 25.
PAPER_CASES = [
    ("<answer>7*3+4</answer>", 1.0),
    ("7*3=21 21+4=25 <answer>7*3+4</answer>", 1.0),
    ("7*3+4", 0.0),                                   # no tag
    ("7*3=21 <answer>7*3+4", 0.0),                    # unclosed tag
    ("<answer>7*3+4</answer> <answer>7+3+4</answer>", 0.0),   # the last block counts
    ("<answer>7+3+4</answer> <answer>7*3+4</answer>", 1.0),
    ("<answer>\n7*3+4\n</answer>", 0.0),              # a leading newline fails the whitelist
    ("<answer>7*3+4\n</answer>", 1.0),                # one final newline passes it
    ("<answer> 7 * 3 + 4 </answer>", 1.0),
    ("<answer>(7*3)+4</answer>", 1.0),
    ("<answer>7*3+4=25</answer>", 0.0),
    ("<answer></answer>", 0.0),
    ("<answer>7*3+4+4-4</answer>", 0.0),              # 4 used three times
    ("<answer>7*3+4</answer>trailing text", 1.0),
]


@pytest.mark.parametrize("completion, paper", PAPER_CASES)
def test_require_answer_tag_gives_the_es_paper_answer_reward(completion, paper):
    task = build_task(TaskConfig(name="countdown", require_answer_tag=True, num_problems=1))
    problem = countdown.Problem(id="p", prompt="", gold={"numbers": [7, 3, 4], "target": 25})
    assert task.score(problem, completion).reward == paper


def test_without_require_answer_tag_untagged_answers_still_count():
    # The project default (kept): the last line, or the text after an unclosed tag.
    for completion in ("7*3+4", "7*3=21 <answer>7*3+4", "<answer>\n7*3+4\n</answer>"):
        assert score_completion([7, 3, 4], 25, completion).correct, completion


def test_require_answer_tag_departs_from_the_paper_only_where_it_would_eval():
    # The paper's code hands "-3+10" to eval (1.0 for numbers [3, 10], target 7); a unary
    # sign is never accepted here, with or without the tag rule.
    assert not score_completion([3, 10], 7, "<answer>-3+10</answer>",
                                require_answer_tag=True).correct
    with pytest.raises(BadInput, match="require_answer_tag is for tasks"):
        TaskConfig(name="math", require_answer_tag=True)


@pytest.mark.parametrize("numbers", [[1234567, 2], [-3, 5]])
def test_loader_refuses_numbers_no_answer_can_use(tmp_path, numbers):
    path = tmp_path / "cd.jsonl"
    path.write_text(json.dumps({"numbers": [3, 4], "target": 7}) + "\n"
                    + json.dumps({"numbers": numbers, "target": 7}) + "\n")
    with pytest.raises(BadInput, match=r"record 1 has numbers .* from 0 to 999999"):
        countdown.load_problems(path)
    path.write_text(json.dumps({"numbers": [999999, 1], "target": 999998}) + "\n")
    (p,) = countdown.load_problems(path)
    assert score_completion(p.gold["numbers"], p.gold["target"], "<answer>999999-1</answer>").correct
