"""``task.select``: a slice of a data file's rows (or of the generated list), then
``task.limit``; slices written on the command line reach the config as written."""

from __future__ import annotations

import json

import pytest

from es_llm.config import load_config
from es_llm.errors import BadInput
from es_llm.evaluate import EvalConfig
from es_llm.tasks import TaskConfig, build_task


@pytest.fixture
def ten_rows(tmp_path):
    """An arithmetic file whose row i has id r<i> and answer i."""
    path = tmp_path / "ten.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"{i}+0=", "answer": i}) + "\n"
                            for i in range(10)))
    return str(path)


def ids(data, **fields):
    return [p.id for p in build_task(TaskConfig(name="arithmetic", data=data, **fields))
            .problems()]


@pytest.mark.parametrize("select, expected", [
    ("0:3", ["r0", "r1", "r2"]),
    ("-2:", ["r8", "r9"]),
    (":2", ["r0", "r1"]),
    ("7:", ["r7", "r8", "r9"]),
    ("-4:-2", ["r6", "r7"]),
    ("5:100", ["r5", "r6", "r7", "r8", "r9"]),
])
def test_select_slices_the_rows_of_a_file(ten_rows, select, expected):
    assert ids(ten_rows, select=select) == expected


def test_select_comes_before_limit(ten_rows):
    assert ids(ten_rows, select="-5:", limit=2) == ["r5", "r6"]
    assert ids(ten_rows, select="2:4", limit=5) == ["r2", "r3"]
    assert ids(ten_rows, limit=2) == ["r0", "r1"]


def test_select_slices_the_generated_list():
    every = [p.id for p in build_task(TaskConfig(num_problems=6)).problems()]
    chosen = [p.id for p in build_task(TaskConfig(num_problems=6, select="-2:")).problems()]
    assert chosen == every[-2:]


@pytest.mark.parametrize("select", ["3", "1:2:3", "a:b", "", "1.5:2", 7])
def test_a_select_that_is_no_slice_is_refused(select):
    with pytest.raises(BadInput, match="task.select must be a slice start:stop"):
        TaskConfig(select=select)


def test_a_select_keeping_no_row_is_refused_with_the_row_count(ten_rows):
    with pytest.raises(BadInput, match="keeps none of the 10 rows"):
        ids(ten_rows, select="20:")


@pytest.mark.parametrize("text", ["-2000:", "2:8", "100:15", ":50", "0:200"])
def test_slices_given_as_overrides_stay_text(text):
    # YAML alone would read -2000: as a mapping and 2:8 as the base-60 integer 128.
    cfg = load_config(EvalConfig, overrides=["model=m", f"task.select={text}"])
    assert cfg.task.select == text
