"""The knowledge task: its world, the held-out split of questions, scoring and the facts
check by hand, bad data files, and the ci knowledge model through `es-llm testtime`."""

from __future__ import annotations

import json
import random

import pytest

from es_llm.cli import main
from es_llm.errors import BadInput
from es_llm.tasks import TaskConfig, build_task, knowledge
from es_llm.tasks.knowledge import (TIERS, facts_hold, fact_statement, generate, held_out,
                                    heldout_bucket, question_facts, solution, world)


def test_the_world_is_fixed_and_well_formed():
    w = world()
    assert w == world() and len(set(w.names)) == knowledge.WORLD_SIZE
    assert all(1 <= w.value[n] <= knowledge.MAX_VALUE for n in w.names)
    assert all(w.likes[n] in w.value and w.likes[n] != n for n in w.names)
    assert world("another seed") != w


def test_a_question_needs_its_facts_and_sums_their_numbers():
    w = world()
    a, b = w.names[:2]
    c = w.likes[a]
    want = [f"{a} likes {c}", f"{c} has {w.value[c]}", f"{b} has {w.value[b]}"]
    assert question_facts(w, f"@{a}+{b}") == want
    total = w.value[c] + w.value[b]
    worked = f"{w.value[c]}+{w.value[b]}={total} <answer>{total}</answer>"
    assert solution(w, f"@{a}+{b}", "solve") == worked
    assert solution(w, f"@{a}+{b}", "direct") == f"<answer>{total}</answer>"
    facts = solution(w, f"@{a}+{b}", "facts")
    assert facts.split("\n")[0] == " ; ".join(question_facts(w, f"@{a}+{b}"))


def _training(n: int = 20000) -> list[tuple[str, str]]:
    rng = random.Random(1)
    out = []
    for _ in range(n):
        problem, completion = generate(rng, rng.choice(TIERS))
        out.append((problem.prompt, completion))
    return out


def test_held_out_questions_are_never_trained_on_but_their_facts_are():
    """The split is by a question's unordered terms: no training prompt, in any role or
    either order, asks a held-out question, and no training completion writes its facts
    line; every fact it needs is a training statement, so it must be composed."""
    train = _training()
    asked = {knowledge.parse_question(p) for p, _ in train} - {None}
    unordered = {"+".join(sorted(q.split("+"))) for q in asked}
    completions = {c for _, c in train}
    stated = {part.strip() for p, c in train if p.startswith("fact ") for part in c.split(";")}
    rng = random.Random(2)
    w = world()
    for _ in range(300):
        problem, _ = held_out(rng, rng.choice(TIERS))
        q = problem.gold["question"]
        assert heldout_bucket(q)
        assert "+".join(sorted(q.split("+"))) not in unordered
        assert not any(c.startswith(solution(w, q, "facts").split("\n")[0] + "\n")
                       for c in completions)
        assert set(question_facts(w, q)) <= stated
    assert stated == {part for n in w.names for part in fact_statement(w, n).split(" ; ")}


def test_scoring_reads_the_integer_answer():
    task = build_task(TaskConfig(name="knowledge", num_problems=6))
    problems = task.problems()
    assert [p.difficulty for p in problems] == [2, 3, 4, 2, 3, 4]
    p = problems[0]
    right = p.gold["answer"]
    scores = task.score_many([(p, f"1+2=3 <answer>{right}</answer>"),
                              (p, f"<answer>{right + 1}</answer>"), (p, "no idea")])
    assert [s.correct for s in scores] == [True, False, False]
    task.close()


def test_votes_count_answers_by_their_integer_value():
    from es_llm.testtime.methods import FORMATS

    value = FORMATS.get("knowledge").value
    assert value(None, "3+4=7 <answer>7</answer>") == value(None, "<answer> 7 </answer>") == 7
    assert value(None, "<answer>x</answer>") is None and value(None, "7") is None


def test_facts_hold_by_hand():
    w = world()
    a, b = w.names[:2]
    c = w.likes[a]
    q = f"@{a}+{b}"
    line = f"{a} likes {c} ; {c} has {w.value[c]} ; {b} has {w.value[b]}"
    assert facts_hold(line + "\n1+1=2 <answer>2</answer>", q)
    # A true fact too many is allowed; a false one, a missing one or noise is not.
    assert facts_hold(f"{line} ; {a} has {w.value[a]}", q)
    assert not facts_hold(line.replace(f"{b} has {w.value[b]}", f"{b} has {w.value[b] + 1}"), q)
    assert not facts_hold(f"{a} likes {c} ; {c} has {w.value[c]}", q)
    assert not facts_hold(f"{line} ; zzzz has 3", q)
    assert not facts_hold("", q)


def test_a_data_file_from_another_world_is_refused(tmp_path):
    w = world()
    a, b = w.names[:2]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": f"ask {a}+{b}\n", "answer": 999}) + "\n")
    with pytest.raises(BadInput, match="this world's facts give"):
        build_task(TaskConfig(name="knowledge", data=str(bad))).problems()
    bad.write_text(json.dumps({"prompt": "ask xxxx+yyyy\n", "answer": 3}) + "\n")
    with pytest.raises(BadInput, match="not a question of this world"):
        build_task(TaskConfig(name="knowledge", data=str(bad))).problems()


@pytest.fixture(scope="module")
def ci_knowledge():
    from es_llm.testbed.build import build_testbed
    from es_llm.testbed.config import load_testbed_config

    path, _ = build_testbed(load_testbed_config("ci", overrides=["knowledge.enabled=true"]),
                            progress=False, echo=lambda *_: None)
    return path / "knowledge"


@pytest.mark.slow
def test_cpp_direct_and_solve_run_on_the_knowledge_model(ci_knowledge, tmp_path, capsys):
    roles = json.loads((ci_knowledge / "roles.json").read_text())["roles"]
    assert roles == ["solve", "direct", "facts"]
    out = tmp_path / "tt"
    assert main(["testtime", "--model", str(ci_knowledge), "--task", "knowledge",
                 "--methods", "independent,direct,cpp", "--budgets", "1,2", "--out", str(out),
                 "--no-progress", "pairs=[]"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["methods"]) == {"independent", "direct", "cpp"}
    assert metrics["config"]["problems"] == 45
    cpp = metrics["methods"]["cpp"]["budgets"]["2"]["stats"]
    assert 0 <= cpp["facts_true_rate"] <= 1
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["prompt"].split()[0] for s in samples} == {"ask", "direct", "facts"}
    # A method that reads Countdown traces is refused on this task, before anything runs.
    capsys.readouterr()
    assert main(["testtime", "--model", str(ci_knowledge), "--task", "knowledge",
                 "--methods", "independent,ttel", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "cannot run" in err and "choose from cpp, direct, independent" in err
    assert not (tmp_path / "x").exists()
