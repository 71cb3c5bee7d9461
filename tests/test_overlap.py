"""Evaluation problems a checkpoint's training run trained on: ``es-llm eval`` and ``es-llm
compare`` warn, and with ``--strict-overlap`` exit with status 2 before sampling."""

from __future__ import annotations

import shutil

import pytest

from es_llm.cli import main
from es_llm.compare.config import CompareConfig
from es_llm.compare.run import check_overlaps, check_inputs
from es_llm.config import dump_yaml
from es_llm.overlap import shared_problems, training_run
from es_llm.tasks import Problem, TaskConfig


def test_problems_are_the_same_when_their_task_prompts_are():
    trained = [Problem("t0", "nums 1 2  make 3\n", 0), Problem("t1", "nums 4 4 make 1", 0)]
    evaluated = [Problem("e0", "nums 1 2 make 3", 0),  # other id, other spacing: the same
                 Problem("e1", "nums 9 9 make 1", 0),
                 Problem("e2", "<|user|>nums 4 4 make 1<|assistant|>", 0,
                         raw_prompt="nums 4 4 make 1")]  # rendered: its raw prompt counts
    assert shared_problems(evaluated, trained) == ["e0", "e2"]
    assert shared_problems(evaluated, []) == []


def test_training_run_is_found_from_a_checkpoint_folder(tmp_path):
    final = tmp_path / "run" / "checkpoints" / "final"
    final.mkdir(parents=True)
    assert training_run(final) is None  # no config.yaml yet
    (tmp_path / "run" / "config.yaml").write_text("task: {name: countdown}\n")
    assert training_run(final) == (tmp_path / "run").resolve()
    assert training_run(tmp_path / "run") is None


@pytest.fixture
def trained_checkpoint(ci_testbed, tmp_path):
    """A run folder that trained on the first 5 rows of the testbed's RL file, with the
    testbed as its final checkpoint."""
    run = tmp_path / "run"
    shutil.copytree(ci_testbed, run / "checkpoints" / "final")
    task = TaskConfig(name="countdown", data=str(ci_testbed / "data" / "countdown_rl.jsonl"),
                      select="0:5")
    (run / "config.yaml").write_text(dump_yaml({"model": str(ci_testbed), "task": task}))
    return run / "checkpoints" / "final"


def eval_args(model, out, *extra):
    return ["eval", "--model", str(model), "--task", "countdown", "--n", "1",
            "--temperature", "0", "--backend", "hf", "--out", str(out), "--no-progress", *extra]


def test_eval_warns_about_training_problems_and_strict_refuses(trained_checkpoint, ci_testbed,
                                                                tmp_path, capsys):
    rl = str(ci_testbed / "data" / "countdown_rl.jsonl")
    assert main(eval_args(trained_checkpoint, tmp_path / "warned", "--data", rl,
                          "--limit", "8")) == 0
    printed = capsys.readouterr().out
    assert printed.count("es-llm: warning: 5 of the 8 evaluation problems") == 1
    assert "countdown-rl-00000" in printed
    # Rows 5.. of the same file were never trained on: no warning.
    assert main(eval_args(trained_checkpoint, tmp_path / "clean", "--data", rl,
                          "--select", "5:8")) == 0
    assert "warning" not in capsys.readouterr().out
    never = tmp_path / "never"
    assert main(eval_args(trained_checkpoint, never, "--data", rl, "--limit", "8",
                          "--strict-overlap")) == 2
    err = capsys.readouterr().err
    assert "5 of the 8 evaluation problems" in err and err.count("\n") == 1
    assert not never.exists()


def test_compare_warns_per_checkpoint_and_strict_exits_2(trained_checkpoint, ci_testbed,
                                                         tmp_path, capsys):
    rl = str(ci_testbed / "data" / "countdown_rl.jsonl")
    cfg = CompareConfig(models=(f"base={ci_testbed}", f"es={trained_checkpoint}"),
                        task=TaskConfig(name="countdown", data=rl, limit=6))
    sources, loaded, _ = check_inputs(cfg, tmp_path / "cmp")
    said = []
    check_overlaps(cfg, sources, loaded, said.append)
    assert len(said) == 1 and said[0].startswith("[compare] es: es-llm: warning: 5 of the 6")
    out = tmp_path / "strict"
    assert main(["compare", "--models", f"base={ci_testbed}", f"es={trained_checkpoint}",
                 "--task", "countdown", "--data", rl, "--limit", "6", "--n", "1",
                 "--backend", "hf", "--strict-overlap", "--out", str(out), "--no-progress"]) == 2
    assert "5 of the 6 evaluation problems" in capsys.readouterr().err
    assert not out.exists()
