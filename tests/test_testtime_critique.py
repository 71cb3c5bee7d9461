"""Critique uptake and peer discussion: uptake conditioned on useful critiques (those that flag
the verifier's first wrong step) computed by hand on four hand-written repairs, the
discussion's statistics by hand, the discussion method end to end through the real token
ledger on a scripted backend (and on the ci reasoning model), and the revise role's hidden
slips, whose step only the critique names."""

from __future__ import annotations

import json

import pytest

from es_llm.backends.base import Completion
from es_llm.tasks import Problem, TaskConfig, build_task, countdown
from es_llm.tasks.countdown_roles import answer_value, parse_verdict, role_prompt
from es_llm.testtime import ttel  # noqa: F401  (registers the branchings the settings name)
from es_llm.testtime.generations import Gen, Generations
from es_llm.testtime.methods import METHODS, MethodInput, TestTimeSettings
from es_llm.testtime.protocols import discussion_stats, peer_line, repair_row, review_metrics

PROBLEM = Problem(id="p", prompt="nums 7 3 4 make 25\n", gold={"numbers": [7, 3, 4], "target": 25})
RIGHT = "7*3=21 21+4=25 <answer>7*3+4</answer>"
MINUS = "7*3=21 21-4=17 <answer>7*3-4</answer>"


def gen_of(text: str, problem: Problem = PROBLEM) -> Gen:
    """A completion as ``Generations.draw`` makes it: one token per character."""
    numbers, target = problem.gold["numbers"], problem.gold["target"]
    score = countdown.score_completion(numbers, target, text)
    return Gen(text=text, num_tokens=len(text), logprobs=None, finish_reason="stop",
               correct=bool(score.correct), value=answer_value(numbers, text),
               answer=score.answer)


# --------------------------------------------------------------------------------------------
# Uptake conditioned on useful critiques
# --------------------------------------------------------------------------------------------

# (draft, critique, repair) on 7 3 4 -> 25; every draft is wrong.
TRACES = [
    # The verifier's first wrong step is 2 (5 is no given number); the critique flags it.
    # The repair rewrites step 2 only and is right: uptake, repaired.
    ("7*3=21 21+5=26 <answer>7*3+5</answer>", "wrong at step 2", RIGHT),
    # First wrong step 1 (8 is no given number), flagged. The repair rewrites steps 1 and 2
    # but is still wrong: uptake, not repaired.
    ("8*3=24 24+4=28 <answer>8*3+4</answer>", "wrong at step 1",
     "7*3=21 21+5=26 <answer>7*3+5</answer>"),
    # Every step checks but ends off the target: wrong at the last step, 2; the critique
    # flags 1. The repair rewrites step 2 only and is right: no uptake, repaired.
    (MINUS, "wrong at step 1", RIGHT),
    # First wrong step 2 (ends at 40), the critique flags 1. The repair rewrites both steps
    # and is right: uptake, repaired.
    ("7+3=10 10*4=40 <answer>(7+3)*4</answer>", "wrong at step 1",
     "7*4=28 28-3=25 <answer>7*4-3</answer>"),
]


def test_uptake_conditioned_on_useful_critiques_by_hand():
    repairs = [repair_row(PROBLEM, gen_of(before), gen_of(after), parse_verdict(critique))
               for before, critique, after in TRACES]
    assert [r["first_wrong"] for r in repairs] == [2, 1, 2, 2]
    assert [r["flagged"] for r in repairs] == [2, 1, 1, 1]
    assert all(r["wrong_before"] and r["changed"] for r in repairs)
    # Four rejections of the wrong drafts, one of a right draft, one right draft passed.
    reviews = [(True, parse_verdict(c)) for _, c, _ in TRACES] + [
        (False, ("wrong", 1)), (False, ("ok", None))]
    m = review_metrics(reviews, repairs, [])
    assert m["reviewer_precision"] == pytest.approx(4 / 5)
    assert m["reviewer_recall"] == 1.0
    # Uptake over all four: traces 1, 2 and 4 touch the flagged step.
    assert m["critique_uptake"] == pytest.approx(3 / 4)
    assert m["useful_critiques"] == 2 and m["other_critiques"] == 2
    # Useful (traces 1, 2): both take the critique up, one is repaired.
    assert m["critique_uptake_useful"] == 1.0 and m["repair_rate_useful"] == 0.5
    # Other (traces 3, 4): one takes it up, both are repaired.
    assert m["critique_uptake_other"] == 0.5 and m["repair_rate_other"] == 1.0
    assert m["guided_repair_rate"] == pytest.approx(3 / 4)
    assert m["self_repair_rate"] is None


def test_an_unlocalised_critique_enters_neither_group():
    before, _, after = TRACES[0]
    row = repair_row(PROBLEM, gen_of(before), gen_of(after), parse_verdict("wrong"))
    m = review_metrics([], [row], [])
    assert m["critique_uptake"] is None and m["useful_critiques"] == m["other_critiques"] == 0
    assert m["guided_repair_rate"] == 1.0


# --------------------------------------------------------------------------------------------
# Peer discussion
# --------------------------------------------------------------------------------------------

def test_peer_line_and_discussion_stats_by_hand():
    assert peer_line(["7*3+4", None, "(7 + 3) * 4"]) == "peers 7*3+4 none (7+3)*4"
    right, minus = gen_of(RIGHT), gen_of(MINUS)
    odd = gen_of("7+3=10 10*4=40 <answer>(7+3)*4</answer>")
    pairs = [(minus, right, [right.value]),   # wrong -> right, a peer's answer
             (minus, odd, [right.value]),     # wrong -> wrong, an answer no peer gave
             (right, right, [minus.value]),   # unchanged
             (right, minus, [minus.value])]   # right -> wrong, a peer's answer
    s = discussion_stats(pairs)
    assert s["revision_changed"] == 0.75
    assert s["discussion_repair_rate"] == 0.5 and s["discussion_break_rate"] == 0.5
    assert s["adopted_peer_answer"] == pytest.approx(2 / 3)


class _ScriptedBackend:
    """Drafts: problem "p" gets RIGHT, MINUS, MINUS; "q" gets RIGHT throughout. A revision
    is RIGHT when its critique line names 7*3+4, else the draft copied unchanged. One token
    per character plus the EOS."""

    name = "scripted"

    def __init__(self):
        self.prompts: list[str] = []

    def generate(self, prompts, params, progress=False, keys=None):
        self.prompts += prompts
        out = []
        for prompt, key in zip(prompts, keys):
            if prompt.startswith("revise"):
                _, trace, critique = prompt.rstrip("\n").split("\n")
                texts = [RIGHT if "7*3+4" in critique.split() else trace]
            else:
                texts = [RIGHT if key.endswith(":q") else [RIGHT, MINUS, MINUS][i % 3]
                         for i in range(params.n)]
            out.append([Completion(t, tuple(range(len(t) + 1)), None, "stop") for t in texts])
        return out


def test_discussion_end_to_end_through_the_ledger():
    other = Problem(id="q", prompt=PROBLEM.prompt, gold=PROBLEM.gold)
    backend = _ScriptedBackend()
    gen = Generations(backend, build_task(TaskConfig(name="countdown")), 1.0, seed=0)
    result = METHODS.get("discussion").run(
        MethodInput(("discussion", 3), [PROBLEM, other], 3, gen, TestTimeSettings()))
    # Each peer reads the others' answers in order, through the trained revise prompt.
    assert backend.prompts[-6:-3] == [
        role_prompt("revise", [7, 3, 4], 25, trace=RIGHT, critique="peers 7*3-4 7*3-4"),
        role_prompt("revise", [7, 3, 4], 25, trace=MINUS, critique="peers 7*3+4 7*3-4"),
        role_prompt("revise", [7, 3, 4], 25, trace=MINUS, critique="peers 7*3+4 7*3-4")]
    # Every draft and every revision is charged to its problem, none as a control.
    tokens = len(RIGHT) + 1, len(MINUS) + 1
    assert gen.cost(("discussion", 3), "p") == (tokens[0] + 2 * tokens[1] + 3 * tokens[0], 0)
    assert gen.cost(("discussion", 3), "q") == (6 * tokens[0], 0)
    assert [r["stage"] for r in gen.rows] == ["solve"] * 6 + ["discuss"] * 6
    assert not any(r["control"] for r in gen.rows)
    # p's drafts vote 7*3-4 (wrong); both wrong peers adopt the right peer's answer.
    p, q = result.outcomes
    assert p["covered"] and p["answered"] and not p["draft_vote_correct"]
    assert q["answered"] and q["draft_vote_correct"]
    s = result.stats
    assert s["draft_vote_accuracy"] == 0.5 and s["final_accuracy"] == 1.0
    assert s["revision_changed"] == pytest.approx(2 / 6)
    assert s["discussion_repair_rate"] == 1.0 and s["discussion_break_rate"] == 0.0
    assert s["adopted_peer_answer"] == 1.0
    assert METHODS.get("discussion").min_budget == 2


@pytest.mark.slow
def test_discussion_on_the_ci_reasoning_model(ci_reasoning, tmp_path):
    from es_llm.cli import main

    out = tmp_path / "tt"
    assert main(["testtime", "--model", str(ci_reasoning), "--methods", "discussion",
                 "--budgets", "2", "--limit", "4", "--out", str(out), "--no-progress",
                 "bootstrap=20"]) == 0
    rows = [json.loads(line) for line in (out / "samples.jsonl").open()]
    outcomes = [json.loads(line) for line in (out / "outcomes.jsonl").open()]
    assert len(outcomes) == 4
    assert sorted(r["stage"] for r in rows) == ["discuss"] * 8 + ["solve"] * 8
    # The ledger is every generation's tokens, problem by problem.
    for o in outcomes:
        assert o["tokens"] == sum(r["num_tokens"] for r in rows
                                  if r["problem_id"] == o["problem_id"])
        assert o["covered"] or not o["answered"]
    stats = json.loads((out / "metrics.json").read_text())["methods"]["discussion"]
    assert set(stats["budgets"]["2"]["stats"]) >= {"revision_changed", "final_accuracy",
                                                  "draft_vote_accuracy"}


# --------------------------------------------------------------------------------------------
# Hidden slips in the revise role's training data
# --------------------------------------------------------------------------------------------
