"""ES beyond one process: where each rank runs (cores, GPU from its local rank), exchanges
that end the job when a rank stops answering, a failing rank ending the job, and four
oversubscribed ranks reproducing one process bitwise."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from es_llm.comm.placement import cores_for_rank, gpu_for_rank
from es_llm.io import complete_jsonl_rows, read_jsonl

ROOT = Path(__file__).resolve().parents[1]
ES = ROOT / "configs" / "es_countdown_ci.yaml"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def mpirun() -> str:
    return shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"


def test_cores_are_split_into_contiguous_even_shares():
    cpus = [4, 0, 1, 2, 3]
    assert [cores_for_rank(r, 2, cpus) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert [cores_for_rank(r, 5, cpus) for r in range(5)] == [[0], [1], [2], [3], [4]]
    assert cores_for_rank(0, 1, cpus) == [0, 1, 2, 3, 4]
    # More ranks than cores: ranks share cores one each, round-robin.
    assert [cores_for_rank(r, 4, [0, 1]) for r in range(4)] == [[0], [1], [0], [1]]
    with pytest.raises(ValueError):
        cores_for_rank(2, 2, cpus)


def test_a_rank_gets_the_gpu_of_its_local_rank():
    assert [gpu_for_rank(r, ["0", "1", "2", "3"]) for r in range(4)] == ["0", "1", "2", "3"]
    # Only some GPUs visible (CUDA_VISIBLE_DEVICES=4,5): ranks take those, sharing beyond.
    assert [gpu_for_rank(r, ["4", "5"]) for r in range(3)] == ["4", "5", "4"]
    with pytest.raises(ValueError):
        gpu_for_rank(0, [])


def test_place_rank_pins_cores_and_chooses_the_gpu_before_cuda_starts():
    code = ("import json, os, torch; from es_llm.comm.placement import place_rank; "
            "cores = place_rank(1, 2, 'cuda', True); "
            "print(json.dumps([cores, sorted(os.sched_getaffinity(0)), torch.get_num_threads(), "
            "os.environ['CUDA_VISIBLE_DEVICES'], os.environ['VLLM_CPU_OMP_THREADS_BIND']]))")
    env = {k: v for k, v in ENV.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    env["CUDA_VISIBLE_DEVICES"] = "4,5"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    mine = cores_for_rank(1, 2, sorted(os.sched_getaffinity(0)))
    assert json.loads(out) == [mine, mine, len(mine), "5", ",".join(map(str, mine))]


@pytest.mark.mpi
def test_an_exchange_ends_the_job_when_a_rank_stops_answering(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("import time\n"
                      "from es_llm.comm.mpi import MPIComm\n"
                      "comm = MPIComm(timeout_s=3)\n"
                      "if comm.rank == 1:\n"
                      "    time.sleep(120)\n"
                      "comm.allgather(comm.rank)\n")
    t0 = time.time()
    proc = subprocess.run([mpirun(), "-n", "2", sys.executable, str(script)], env=ENV,
                          capture_output=True, text=True, timeout=100)
    assert time.time() - t0 < 60
    assert proc.returncode != 0
    assert re.search(r"rank 1 \(\S+ pid \d+\) did not answer for 3 s", proc.stderr), \
        proc.stderr[-2000:]


def es_mpi(ranks: int, out: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen([mpirun(), "-n", str(ranks), sys.executable, "-m", "es_llm", "es",
                             "--config", str(ES), "--out", str(out), "--no-progress", *extra],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.mpi
@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_naming_it(ci_testbed, tmp_path):
    run = tmp_path / "run"
    proc = es_mpi(2, run, f"model={ci_testbed}", "iterations=1000", "comm_timeout_s=10",
                  "checkpoint_every=1000")
    pid = None
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if complete_jsonl_rows(run / "ledger.jsonl"):
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        ps = subprocess.run(["pgrep", "-f", f"es_llm es --config {ES} --out {run}"],
                            capture_output=True, text=True).stdout.split()
        # The two ranks; rank 1 is the one whose environment says so.
        for candidate in ps:
            environ = Path(f"/proc/{candidate}/environ").read_bytes().split(b"\0")
            if b"PMI_RANK=1" in environ:
                pid = int(candidate)
        assert pid is not None, ps
        os.kill(pid, signal.SIGSTOP)
        t0 = time.time()
        out, err = proc.communicate(timeout=200)
        assert time.time() - t0 < 120
    finally:
        if pid is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert re.search(rf"rank 1 \(\S+ pid {pid}\) did not answer for 10 s", err), err[-2000:]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_rank_that_fails_ends_the_job_with_its_reason(ci_testbed, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text("in the way")  # rank 0 cannot save its first checkpoint
    proc = es_mpi(2, run, f"model={ci_testbed}", "iterations=4", "checkpoint_every=1")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "es-llm es: error: could not write" in err and "--resume" in err, err[-2000:]


@pytest.mark.mpi
@pytest.mark.slow
def test_four_oversubscribed_ranks_give_bitwise_the_serial_run(ci_testbed, tmp_path):
    serial = subprocess.run([sys.executable, "-m", "es_llm", "es", "--config", str(ES), "--out",
                             str(tmp_path / "one"), "--no-progress", f"model={ci_testbed}"],
                            env=ENV, capture_output=True, text=True, timeout=600)
    assert serial.returncode == 0, serial.stderr[-2000:]
    four = es_mpi(4, tmp_path / "four", f"model={ci_testbed}")
    _, err = four.communicate(timeout=900)
    assert four.returncode == 0, err[-3000:]
    assert read_jsonl(tmp_path / "one" / "ledger.jsonl") == \
        read_jsonl(tmp_path / "four" / "ledger.jsonl")
    weights = lambda run: (run / "checkpoints" / "final" / "model.safetensors").read_bytes()  # noqa: E731
    assert weights(tmp_path / "one") == weights(tmp_path / "four")
    # Every rank kept the libraries' messages in its own log file, not on the terminal.
    assert sorted(p.name for p in (tmp_path / "four").glob("log*.txt")) == \
        ["log.rank1.txt", "log.rank2.txt", "log.rank3.txt", "log.txt"]
