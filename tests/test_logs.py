"""Quiet runs: the libraries' messages go to the output folder's log.txt, es-llm's own lines
stay on the terminal, --verbose shows everything; an in-process call leaves stderr, logging
and warnings as they were."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from es_llm.logs import LibraryLog

ROOT = Path(__file__).resolve().parents[1]


def es_llm(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "es_llm", *args], capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_messages_go_to_the_log_file_unless_verbose(ci_testbed, tmp_path):
    common = ["eval", "--model", str(ci_testbed), "--task", "countdown", "--n", "1",
              "--backend", "vllm", "--no-progress", "task.limit=4"]
    quiet = es_llm(*common, "--out", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stderr == ""
    assert "evaluating" in quiet.stdout and "pass@k" in quiet.stdout
    log = (tmp_path / "quiet" / "log.txt").read_text()
    assert "vllm" in log and "WARNING" in log
    loud = es_llm(*common, "--out", str(tmp_path / "loud"), "--verbose")
    assert loud.returncode == 0
    # vLLM's own logging config prints to standard output.
    assert "This model does not officially support" in loud.stdout + loud.stderr


@pytest.mark.parametrize("engine_configured", [False, True])
def test_library_output_is_captured_and_everything_is_put_back(tmp_path, capfd,
                                                               engine_configured):
    engine = logging.getLogger("vllm")
    saved_engine = engine.handlers[:], engine.propagate
    if engine_configured:
        # What importing vLLM before the command starts leaves behind.
        engine.handlers, engine.propagate = [logging.StreamHandler(sys.stdout)], False
    engine_state = engine.handlers[:], engine.propagate
    stderr, handlers = sys.stderr, list(logging.getLogger().handlers)
    log = LibraryLog().start()
    logging.getLogger("vllm.engine").warning("engine chatter")
    warnings.warn("a library's deprecation notice")
    os.write(2, b"written by C code\n")
    print("es-llm's own line", file=sys.stderr)
    folder = tmp_path / "run"
    folder.mkdir()
    log.attach(folder)
    os.write(2, b"after the folder exists\n")
    log.finish(0)
    assert sys.stderr is stderr and logging.getLogger().handlers == handlers
    text = (folder / "log.txt").read_text()
    for line in ("engine chatter", "a library's deprecation notice", "written by C code",
                 "after the folder exists"):
        assert line in text
    said = capfd.readouterr()
    assert "es-llm's own line" in said.err and "engine chatter" not in said.err + said.out
    assert "written by C code" not in said.err
    assert (engine.handlers, engine.propagate) == engine_state
    engine.handlers, engine.propagate = saved_engine


def test_a_log_without_a_folder_is_removed_unless_the_command_crashed(capfd):
    ok = LibraryLog().start()
    os.write(2, b"noise\n")
    path = ok.path
    ok.finish(2)
    assert not path.exists()
    crashed = LibraryLog().start()
    os.write(2, b"the library's last words\n")
    crashed.finish(1)
    assert crashed.path.read_text() == "the library's last words\n"
    assert str(crashed.path) in capfd.readouterr().err
    crashed.path.unlink()
