"""``es-llm`` end to end on the ci testbed, and its handling of bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from es_llm.cli import main
from es_llm.io import read_jsonl


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-m", "es_llm", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


def check_eval_folder(out: Path, n: int, num_problems: int):
    rows = read_jsonl(out / "samples.jsonl")
    assert len(rows) == n * num_problems
    keys = {"problem_id", "sample_index", "prompt", "completion", "reward", "correct", "answer"}
    assert keys <= set(rows[0])
    metrics = json.loads((out / "metrics.json").read_text())
    from es_llm.metrics.passk import ks_powers_of_two
    for k in ks_powers_of_two(n):
        entry = metrics[f"pass@{k}"]
        assert entry["ci95"][0] <= entry["value"] <= entry["ci95"][1]
    # pass@k is the mean over problems of the unbiased estimate from these very samples.
    from es_llm.metrics.passk import pass_at_k
    by_problem: dict = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(r["correct"])
    expected = sum(pass_at_k(len(v), sum(v), 2) for v in by_problem.values()) / len(by_problem)
    assert metrics["pass@2"]["value"] == pytest.approx(expected)
    assert {"maj@1", "pass^1", "coverage", "diversity"} <= set(metrics)
    return rows, metrics


def test_eval_with_hf_backend(ci_testbed, tmp_path, capsys):
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(ci_testbed), "--task", "countdown", "--n", "8",
                 "--temperature", "1.0", "--backend", "hf", "--out", str(out), "--no-progress",
                 "task.limit=20"])
    assert code == 0
    rows, metrics = check_eval_folder(out, 8, 20)
    printed = capsys.readouterr().out
    assert "pass@k" in printed and "coverage" in printed
    # The testbed's own held-out set was used, in order.
    held_out = read_jsonl(ci_testbed / "data" / "countdown_eval.jsonl")
    assert rows[0]["problem_id"] == held_out[0]["id"]
    assert (out / "config.yaml").is_file()


@pytest.mark.vllm
@pytest.mark.slow
def test_eval_with_vllm_backend_from_a_yaml_config(ci_testbed, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"model: {ci_testbed}\ntask:\n  name: countdown\n  limit: 20\n"
                   f"sampling:\n  n: 8\n  temperature: 1.0\nbackend: vllm\n")
    out = tmp_path / "eval"
    proc = run_cli("eval", "--config", str(cfg), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_eval_folder(out, 8, 20)
    assert json.loads((out / "metrics.json").read_text())["config"]["backend"] == "vllm"


def test_eval_on_a_data_file_with_the_arithmetic_task(ci_testbed, tmp_path):
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(ci_testbed), "--task", "arithmetic", "--n", "2",
                 "--temperature", "0", "--backend", "hf", "--out", str(out), "--no-progress",
                 "--data", str(ci_testbed / "data" / "arithmetic_eval.jsonl"), "--limit", "10"])
    assert code == 0
    check_eval_folder(out, 2, 10)


@pytest.mark.parametrize("extra, message", [
    (["sampling.nn=3"], "unknown config key 'sampling.nn'"),
    (["sampling.n=many"], "'sampling.n' must be an integer"),
    (["--task", "go"], "task.name 'go' is not a registered task"),
    (["backend=tpu"], "unknown backend 'tpu'"),
])
def test_bad_input_exits_2_with_one_paragraph(ci_testbed, tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    args = ["eval", "--model", str(ci_testbed), "--task", "countdown", "--out", str(out),
            "--backend", "hf", *extra]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


def test_missing_model_and_bad_data_file(tmp_path, ci_testbed, capsys):
    assert main(["eval", "--model", str(tmp_path / "nope"), "--task", "countdown",
                 "--out", str(tmp_path / "o1")]) == 2
    assert "is not a Hugging Face model folder" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": 1, "prompt": "nums 1 2 make 3\n", "numbers": [1, 2]}) + "\n")
    assert main(["eval", "--model", str(ci_testbed), "--task", "countdown", "--data", str(bad),
                 "--backend", "hf", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "target" in err and str(bad) in err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_cli_process_exit_status_and_help():
    proc = run_cli("eval", "--model", "/nonexistent", "--task", "countdown", "--out", "/tmp/x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    helped = run_cli("eval", "--help")
    assert helped.returncode == 0
    for flag in ("--model", "--task", "--n", "--temperature", "--top-p", "--max-tokens",
                 "--seed", "--backend", "--data", "--select", "--limit", "--strict-overlap",
                 "--config", "--out"):
        assert flag in helped.stdout


def test_eval_on_math500_runs_the_math_verifier(ci_testbed, tmp_path, shared_data):
    # The testbed cannot solve MATH-500; this checks the path: file loading, prompts,
    # verification in the worker process, and a complete samples/metrics folder.
    out = tmp_path / "eval"
    args = ("eval", "--model", str(ci_testbed), "--task", "math", "--data",
            str(shared_data / "math" / "math500.jsonl"), "--n", "2", "--max-tokens", "16",
            "--backend", "hf", "--out", str(out), "--no-progress")
    # The second problem is 258 characters, each a token of the testbed's tokenizer: past
    # the model's 256 positions before a token is generated. Refused at load, naming the
    # prompt's tokens, max_tokens and the context, and nothing written.
    long = run_cli(*args, "--limit", "2")
    assert long.returncode == 2
    assert all(str(n) in long.stderr for n in ("258 tokens", "max_tokens is 16", "274",
                                               "is 256 tokens"))
    assert not out.exists()
    proc = run_cli(*args, "--limit", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, metrics = check_eval_folder(out, 2, 1)
    assert rows[0]["prompt"].startswith("Convert the point $(0,3)$")
    assert all(r["reward"] == 0.0 for r in rows)


def test_missing_data_file_and_bad_sampling_values(ci_testbed, tmp_path, capsys):
    assert main(["eval", "--model", str(ci_testbed), "--task", "countdown", "--data",
                 str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["eval", "--model", str(ci_testbed), "--task", "countdown", "--n", "0",
                 "--out", str(tmp_path / "o")]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_testbed_cli_rejects_bad_overrides(tmp_path, capsys):
    assert main(["testbed", "--size", "ci", "--out", str(tmp_path / "tb"), "train.stepz=3"]) == 2
    assert "unknown config key 'train.stepz'" in capsys.readouterr().err


def test_flags_win_over_the_config_file(ci_testbed, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"model: {ci_testbed}\ntask:\n  name: countdown\n  limit: 3\n"
                   f"sampling:\n  n: 4\n  temperature: 1.0\nbackend: hf\n")
    out = tmp_path / "eval"
    assert main(["eval", "--config", str(cfg), "--n", "2", "--out", str(out),
                 "--no-progress", "task.limit=2"]) == 0
    assert len(read_jsonl(out / "samples.jsonl")) == 2 * 2
