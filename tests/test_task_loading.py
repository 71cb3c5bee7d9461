"""Reading local data files, the messages of bad ones, and TaskConfig / registry checks."""

from __future__ import annotations

import json

import pytest

from es_llm.errors import BadInput
from es_llm.tasks import TaskConfig, build_task, task_names
from es_llm.tasks import countdown
from es_llm.tasks.loading import load_records


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(BadInput, match="nowhere.jsonl' does not exist"):
        load_records(tmp_path / "nowhere.jsonl")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(BadInput, match="unsupported extension '.csv'"):
        load_records(path)


def test_missing_field_names_field_and_fields_present(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": 1, "prompt": "p", "answer": 3},
                                               {"id": 2, "prompt": "q"}])
    with pytest.raises(BadInput) as err:
        load_records(path, {"prompt": ("prompt",), "answer": ("answer",)})
    msg = str(err.value)
    assert "p.jsonl" in msg and "record 1" in msg
    assert "lacks required field(s) answer;" in msg and "has fields id, prompt" in msg


def test_alternative_field_names(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"context": "full prompt", "n": 1},
                                               {"prompt": "own prompt", "context": "x"}])
    records = load_records(path, {"prompt": ("prompt", "context")})
    assert [r["prompt"] for r in records] == ["full prompt", "own prompt"]
    assert records[0]["n"] == 1  # other fields are kept
    bad = _write_jsonl(tmp_path / "d.jsonl", [{"text": "no prompt"}])
    with pytest.raises(BadInput, match=r"prompt \(as any of prompt, context\).*fields text"):
        load_records(bad, {"prompt": ("prompt", "context")})


def test_limit_keeps_the_first_records(tmp_path):
    path = _write_jsonl(tmp_path / "l.jsonl", [{"i": i} for i in range(10)])
    assert [r["i"] for r in load_records(path, limit=3)] == [0, 1, 2]


def test_json_array_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"numbers": [6, 2], "target": "3", "id": 9}]))
    (p,) = countdown.load_problems(path)
    assert (p.id, p.gold) == ("9", {"numbers": [6, 2], "target": 3})


def test_invalid_json_is_bad_input(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"a": 1}\n{"a": 2\n')
    with pytest.raises(BadInput, match=r"broken.jsonl' is not valid JSON / JSON Lines \(line 2\)"):
        load_records(path)


def test_records_that_are_not_objects_lack_fields(tmp_path):
    path = tmp_path / "numbers.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(BadInput, match="record 0 lacks required field"):
        load_records(path, {"numbers": ("numbers",)})


def test_parquet_round_trip(tmp_path):
    import datasets

    rows = [{"id": "a", "prompt": "nums 6 2 make 3\n", "numbers": [6, 2], "target": 3,
             "difficulty": 2},
            {"id": "b", "prompt": "nums 7 3 4 make 25\n", "numbers": [7, 3, 4], "target": 25,
             "difficulty": 3}]
    path = tmp_path / "cd.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    assert load_records(path) == rows
    task = build_task(TaskConfig(name="countdown", data=str(path), limit=1))
    (p,) = task.problems()
    assert task.score(p, "<answer>6/2</answer>").correct


def test_unreadable_parquet_is_bad_input(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(BadInput, match="junk.parquet' could not be read as parquet"):
        load_records(path)


# --- TaskConfig and the registry ------------------------------------------------------------

def test_registered_names():
    assert task_names() == ["arithmetic", "chess", "countdown", "humaneval", "knowledge", "math",
                            "pyfunc"]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": "go"}, "task.name 'go' is not a registered task; choose one of "
                     "arithmetic, chess, countdown, humaneval, knowledge, math, pyfunc."),
    ({"data": "problems.csv"}, "unsupported extension"),
    ({"data": ""}, "task.data must be a file path or null"),
    ({"limit": 0}, "task.limit must be a positive integer or null"),
    ({"num_problems": -1}, "task.num_problems must be a positive integer, got -1"),
    ({"seed": 1.5}, "task.seed must be an integer"),
    ({"tiers": (2, 0)}, "task.tiers must be a list of positive integers"),
    ({"timeout_s": 0}, "task.timeout_s must be a positive number"),
    ({"format_weight": 1.0}, "task.format_weight must lie in [0, 1)"),
    ({"format_weight": True}, "task.format_weight must lie in [0, 1)"),
])
def test_task_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(BadInput) as err:
        TaskConfig(**kwargs)
    assert fragment in str(err.value)


def test_task_config_accepts_yaml_lists_and_is_hashable():
    cfg = TaskConfig(name="arithmetic", tiers=[2, 3])
    assert cfg.tiers == (2, 3) and hash(cfg) == hash(TaskConfig(name="arithmetic", tiers=(2, 3)))


def test_json_with_mixed_types_keeps_values_as_written(tmp_path):
    # A field that is a list in one record and a string in the next has no single Arrow
    # type; `datasets` would turn "2" into 2, so such a file is read by the standard library.
    path = _write_jsonl(tmp_path / "mixed.jsonl", [{"problem": "a", "final_answer": ["$1$"]},
                                                   {"problem": "b", "final_answer": "2"}])
    assert [r["final_answer"] for r in load_records(path)] == [["$1$"], "2"]
