"""Code tasks: HumanEval's canonical solutions pass, pyfunc problems are well posed and scored
by behaviour, and bad data or settings are refused clearly."""

from __future__ import annotations

import ast
import json
import random

import pytest

from es_llm.errors import BadInput
from es_llm.tasks import TaskConfig, build_task
from es_llm.tasks import pyfunc
from es_llm.tasks.code import completion_code, humaneval_program


@pytest.fixture(scope="module")
def humaneval():
    task = build_task(TaskConfig(name="humaneval"))
    yield task
    task.close()


def test_all_164_canonical_solutions_pass(humaneval):
    problems = humaneval.problems()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    scores = humaneval.score_many([(p, p.meta["solution"]) for p in problems])
    failed = [(p.id, s.error) for p, s in zip(problems, scores) if not s.correct]
    assert failed == []
    assert all(s.reward == 1.0 and s.format_ok for s in scores)


def test_wrong_and_hostile_completions_fail(humaneval):
    problems = humaneval.problems()[:8]
    pairs = [(p, "    return None\n") for p in problems]
    pairs += [(p, "    import os\n    os._exit(0)\n") for p in problems[:2]]
    pairs += [(problems[0], "    return True\n"), (problems[0], "    return False\n")]
    scores = humaneval.score_many(pairs)
    assert not any(s.correct for s in scores)
    assert all(s.reward == 0.0 for s in scores)


def test_program_assembly_follows_codex_stops_and_fenced_blocks():
    prompt = "def f(x):\n    \"\"\"Double.\"\"\"\n"
    assert humaneval_program(prompt, "    return 2 * x\n\ndef g():\n    pass\n") == \
        prompt + "    return 2 * x\n"
    assert humaneval_program(prompt, "    return 2 * x\nprint(f(3))") == prompt + "    return 2 * x"
    fenced = "Here you go:\n```python\ndef f(x):\n    return x + x\n```\nDone."
    code, was_fenced = completion_code(fenced)
    assert was_fenced and code == "def f(x):\n    return x + x\n"
    assert humaneval_program(prompt, fenced).endswith("\ndef f(x):\n    return x + x\n")


def test_fenced_full_function_scores(humaneval):
    p = humaneval.problems()[2]  # truncate_number: return the decimal part
    assert p.gold["entry_point"] == "truncate_number"
    good = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    s = humaneval.score(p, good)
    assert s.correct and s.reward == 1.0


def refuses(path, task_name: str, row: dict, match: str) -> None:
    """A data file holding only ``row`` is refused with BadInput matching ``match``."""
    path.write_text(json.dumps(row) + "\n")
    task = build_task(TaskConfig(name=task_name, data=str(path)))
    try:
        with pytest.raises(BadInput, match=match):
            task.problems()
    finally:
        task.close()


def test_humaneval_data_file_is_checked(tmp_path):
    path = tmp_path / "he.jsonl"
    refuses(path, "humaneval", {"task_id": "x/0", "prompt": "def f():\n", "entry_point": "f",
                                "test": "assert True\n"}, "check\\(candidate\\)")
    refuses(path, "humaneval", {"task_id": "x/0", "prompt": "def f():\n"}, "entry_point")


def test_pyfunc_generator_is_seeded_distinct_and_tiered():
    a = build_task(TaskConfig(name="pyfunc", num_problems=80, seed=3))
    b = build_task(TaskConfig(name="pyfunc", num_problems=80, seed=3))
    try:
        pa, pb = a.problems(), b.problems()
        assert [(p.prompt, p.gold) for p in pa] == [(p.prompt, p.gold) for p in pb]
        assert len({p.prompt for p in pa}) == 80
        assert [p.difficulty for p in pa[:8]] == [1, 2, 3, 4, 1, 2, 3, 4]
        assert all(len(p.gold["tests"]) == pyfunc.HIDDEN for p in pa)
        # Prompt and solution fit the testbed's context with room to spare.
        assert max(len(p.prompt) + len(p.meta["solution"]) for p in pa) < 200
    finally:
        a.close()
        b.close()


def test_pyfunc_problems_are_determined_by_their_examples():
    """No other function of the tier matches the shown examples yet fails the hidden tests."""
    rng = random.Random(0)
    for tier in pyfunc.TIERS:
        rivals = [(f, c) for f in pyfunc._families(tier) for c in pyfunc._constants(f)]
        for _ in range(30):
            problem, completion = pyfunc.generate(rng, tier)
            shown = problem.prompt.splitlines()[0][2:].split("; ")
            assert len(shown) == pyfunc.SHOWN
            hidden_in = [args[0] for args, _ in problem.gold["tests"]]
            want = [expected for _, expected in problem.gold["tests"]]
            arg = problem.prompt.split("def f(")[1].split(")")[0]
            shown_in = [ast.literal_eval(s.split(" == ")[0][2:-1]) for s in shown]
            shown_out = [ast.literal_eval(s.split(" == ")[1]) for s in shown]
            for family, consts in rivals:
                if family[0] != arg:
                    continue
                if pyfunc._outputs(family, consts, shown_in) == shown_out:
                    assert pyfunc._outputs(family, consts, hidden_in) == want


def test_pyfunc_scores_behaviour_not_spelling():
    task = build_task(TaskConfig(name="pyfunc", num_problems=40, tiers=(1,)))
    try:
        problems = task.problems()
        refs = task.score_many([(p, p.meta["solution"]) for p in problems])
        assert all(s.correct and s.reward == 1.0 and s.format_ok for s in refs)
        probe = problems[0]
        same = task.score_many([(probe, probe.meta["solution"]),
                                (probe, "    y = " + probe.meta["solution"].strip()[7:]
                                 + "\n    return y\n")])
        assert same[0].correct and same[1].correct
        assert same[0].answer_key == same[1].answer_key
        assert same[0].solution_key != same[1].solution_key
        bad = task.score_many([(probe, "    return x\n"), (probe, "    return (\n"),
                               (probe, "return 1\n"), (probe, "")])
        assert not any(s.correct for s in bad)
        assert bad[0].format_ok and not bad[1].format_ok
        assert bad[0].answer_key != same[0].answer_key
        # Text after the body (a new top-level statement) is not part of f.
        tail = task.score(probe, probe.meta["solution"] + "import os\nos._exit(0)\n")
        assert tail.correct
    finally:
        task.close()


def test_pyfunc_record_files_load_back_and_bad_ones_are_refused(tmp_path):
    from es_llm.testbed.train import record

    task = build_task(TaskConfig(name="pyfunc", num_problems=12))
    try:
        problems = task.problems()
    finally:
        task.close()
    path = tmp_path / "pyfunc_eval.jsonl"
    path.write_text("".join(json.dumps(record(p)) + "\n" for p in problems))
    loaded = build_task(TaskConfig(name="pyfunc", data=str(path)))
    try:
        back = loaded.problems()
        assert [(p.prompt, p.gold, p.difficulty) for p in back] == \
            [(p.prompt, p.gold, p.difficulty) for p in problems]
        assert all(s.correct for s in loaded.score_many([(p, p.meta["solution"]) for p in back]))
    finally:
        loaded.close()
    refuses(path, "pyfunc", {"prompt": "def f(x):\n", "tests": [[1, 2]]}, "args a list")


def test_code_task_settings_are_validated():
    with pytest.raises(BadInput, match="task.workers"):
        TaskConfig(name="pyfunc", workers=-1)
    with pytest.raises(BadInput, match="unsafe_no_sandbox"):
        TaskConfig(name="pyfunc", unsafe_no_sandbox="yes")
    with pytest.raises(BadInput, match="tiers"):
        build_task(TaskConfig(name="pyfunc", tiers=(5,)))


def test_eval_reference_backend_runs_humaneval(tmp_path):
    from es_llm.cli import main

    main(["eval", "--task", "humaneval", "--backend", "reference", "--n", "1", "--limit", "20",
          "--out", str(tmp_path / "ref"), "--no-progress"])
    metrics = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    assert metrics["pass@1"]["value"] == 1.0 and metrics["config"]["backend"] == "reference"
    rows = [json.loads(line) for line in (tmp_path / "ref" / "samples.jsonl").open()]
    assert len(rows) == 20 and all(r["correct"] for r in rows)


def test_repeated_programs_are_judged_once():
    task = build_task(TaskConfig(name="pyfunc", num_problems=4, tiers=(1,)))
    try:
        p = task.problems()[0]
        calls = []
        run_many = task.runner.run_many
        task.runner.run_many = lambda jobs: calls.append(len(jobs)) or run_many(jobs)
        first = task.score_many([(p, p.meta["solution"])] * 5 + [(p, "    return 0\n")] * 3)
        again = task.score_many([(p, p.meta["solution"]), (p, "    return 0\n")])
        assert calls == [2, 0]
        assert [s.correct for s in first] == [True] * 5 + [False] * 3
        assert again == [first[0], first[5]]
    finally:
        task.close()
