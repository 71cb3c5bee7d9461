"""The ES engine on the ci testbed: exact perturb/restore, members served as the library
computes them, seeds-only MPI giving the same weights as one process, the run folder, and
bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from es_llm.backends.base import Completion
from es_llm.cli import main
from es_llm.comm.serial import SerialComm
from es_llm.errors import BadInput
from es_llm.es.config import ESRunConfig
from es_llm.es.engine import Edges, evaluate_members, generated_tokens
from es_llm.es.weights import ModuleWeights, select_parameters
from es_llm.io import read_jsonl
from es_llm.tasks import Problem, Score
from populations import es as pes
from populations.es import ESConfig

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "configs" / "es_countdown_ci.yaml"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_perturb_then_restore_is_bitwise_exact(ci_testbed, dtype):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    w = ModuleWeights(model, select_parameters(model, "all"))
    g = torch.Generator().manual_seed(0)
    w.perturb(lambda name, shape: torch.randn(shape, generator=g), +1, 1e-3)
    moved = sum(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert moved > 0
    w.restore()
    for n, p in model.named_parameters():
        assert torch.equal(before[n], p), n


class _Recorder:
    """A backend that records the served weights each time a member generates; its k-th
    call answers every prompt with k tokens."""

    def __init__(self, model):
        self.model, self.served = model, []

    def generate(self, prompts, params, keys=None):
        self.served.append({n: p.detach().clone() for n, p in self.model.named_parameters()})
        return [[Completion(text="", token_ids=(7,) * len(self.served), logprobs=None,
                            finish_reason="stop")] for _ in prompts]


class _Zero:
    def score_many(self, pairs):
        return [Score(reward=0.0, correct=False) for _ in pairs]


def test_the_engine_serves_each_member_as_the_library_perturb_computes_it(ci_testbed):
    # One function computes a member's weights: what the engine writes into the served bf16
    # model for member m is bitwise populations.es.perturbed_params(m), and the restore at
    # the end gives the base weights back bitwise.
    model = AutoModelForCausalLM.from_pretrained(ci_testbed, dtype=torch.bfloat16)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights = ModuleWeights(model, select_parameters(model, "all"))
    cfg = ESRunConfig(es=ESConfig(population=4, sigma=0.05, antithetic=True), seed=11)
    recorder = _Recorder(model)
    edges = Edges(comm=SerialComm(), model=model, tokenizer=None, weights=weights,
                  backend=recorder, task=_Zero())
    state = pes.init(cfg.es, weights.master, cfg.seed)
    members = pes.ask(cfg.es, state)
    scored = evaluate_members(edges, state, members, [Problem("p", "prompt", None)], cfg)
    assert len(recorder.served) == len(members)
    # Member k (one prompt, the k-th call) generated k tokens: 1 + 2 + 3 + 4 in all.
    assert [scored[m.index][5] for m in members] == [1, 2, 3, 4]
    assert generated_tokens(scored) == {"tokens/iteration": 10.0}
    for m, served in zip(members, recorder.served):
        want = pes.perturbed_params(cfg.es, state, m, dtype=torch.bfloat16)
        assert all(torch.equal(served[n], want[n]) for n in want), m
    first = next(iter(before))
    assert not torch.equal(recorder.served[0][first], before[first])  # the member moved it
    for n, p in model.named_parameters():
        assert torch.equal(before[n], p), n


def test_parameter_filters(ci_testbed):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    everything = select_parameters(model, "all")
    matrices = select_parameters(model, "matrices")
    assert set(matrices) < set(everything)
    assert all(dict(model.named_parameters())[n].ndim >= 2 for n in matrices)
    assert select_parameters(model, "regex", r"layers\.1\.") == \
        [n for n in everything if "layers.1." in n]
    with pytest.raises(BadInput, match="valid filters are: all, matrices, regex"):
        select_parameters(model, "some")
    with pytest.raises(BadInput, match="selects no parameters"):
        select_parameters(model, "regex", "nothing-matches-this")


def es_cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "es_llm", "es", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_serial_run_writes_the_run_folder(ci_testbed, tmp_path):
    out = tmp_path / "run"
    code = main(["es", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}"])
    assert code == 0
    cfg = (out / "config.yaml").read_text()
    assert "population: 8" in cfg
    metrics = read_jsonl(out / "metrics.jsonl")
    ledger = read_jsonl(out / "ledger.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert {"es/reward_mean", "es/update_norm", "perf/iter_s"} <= set(metrics[0])
    assert len(ledger[0]["members"]) == 8 and len(ledger[0]["rewards_N"]) == 8
    # The logged reward mean is the mean of the ledger's member rewards.
    assert metrics[0]["es/reward_mean"] == pytest.approx(sum(ledger[0]["rewards_N"]) / 8)
    # Every member's completion of every prompt: at least one token, at most max_tokens.
    samples = metrics[0]["samples/generated"]
    assert samples <= metrics[0]["tokens/iteration"] <= samples * yaml.safe_load(cfg)["max_tokens"]
    for ckpt in ("step_2", "final"):
        model = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / ckpt)
        assert model.config.model_type == "llama"
    # A checkpoint carries the testbed's held-out sets, so `es-llm eval` uses them.
    assert (out / "checkpoints" / "final" / "data" / "countdown_eval.jsonl").is_file()
    # The update moved the weights whenever rewards differed between members.
    base = AutoModelForCausalLM.from_pretrained(ci_testbed).state_dict()
    final = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "final").state_dict()
    assert any(not torch.equal(base[k], final[k]) for k in base)


def mpi_es(ci_testbed, out, *extra) -> subprocess.CompletedProcess:
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([mpirun, "-n", "2", sys.executable, "-m", "es_llm", "es",
                           "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                           f"model={ci_testbed}", *extra],
                          capture_output=True, text=True, env=env, timeout=600)


def final_weights(out: Path) -> bytes:
    return (out / "checkpoints" / "final" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def serial_hf_run(ci_testbed, tmp_path_factory) -> Path:
    """The reference every multi-rank run must reproduce: one process on transformers."""
    out = tmp_path_factory.mktemp("serial") / "run"
    serial = es_cli("--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                    f"model={ci_testbed}", "backend=hf")
    assert serial.returncode == 0, serial.stderr[-3000:]
    return out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_mpirun_two_ranks_gives_bitwise_the_serial_weights(ci_testbed, tmp_path, serial_hf_run,
                                                           backend):
    # With vLLM the same keyed noise is placed into its fused layout, the greedy
    # completions are the same, so the rewards and the update are bitwise the same too.
    two = mpi_es(ci_testbed, tmp_path / "two", f"backend={backend}")
    assert two.returncode == 0, two.stderr[-3000:]
    assert read_jsonl(serial_hf_run / "ledger.jsonl") == read_jsonl(tmp_path / "two" / "ledger.jsonl")
    assert final_weights(serial_hf_run) == final_weights(tmp_path / "two")
    assert len(read_jsonl(tmp_path / "two" / "metrics.jsonl")) == 4


@pytest.mark.parametrize("override, message", [
    ("es.sigma=0", "config key 'es.sigma': sigma must be a positive number"),
    ("es.population=7 es.antithetic=true", "config key 'es.population': antithetic sampling needs an even"),
    ("engine.params=some", "unknown engine.params 'some'"),
    ("es.shaping=best", "config key 'es.shaping': unknown shaping 'best'"),
])
def test_es_bad_input_exits_2(ci_testbed, tmp_path, capsys, override, message):
    code = main(["es", "--config", str(CI_CONFIG), "--out", str(tmp_path / "never"),
                 f"model={ci_testbed}", *override.split()])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_es_missing_model_exits_2(tmp_path, capsys):
    assert main(["es", "--config", str(CI_CONFIG), "--out", str(tmp_path / "o"),
                 f"model={tmp_path / 'missing'}"]) == 2
    assert "not a Hugging Face model folder" in capsys.readouterr().err


def test_resume_after_a_stop_gives_bitwise_the_uninterrupted_weights(ci_testbed, tmp_path):
    common = ["--config", str(CI_CONFIG), "--no-progress", f"model={ci_testbed}",
              "es.optimizer=adam", "es.shaping=group_zscore"]
    assert main(["es", "--out", str(tmp_path / "full"), *common, "iterations=4"]) == 0
    assert main(["es", "--out", str(tmp_path / "part"), *common, "iterations=2"]) == 0
    assert main(["es", "--resume", str(tmp_path / "part"), "--no-progress", "iterations=4"]) == 0
    assert final_weights(tmp_path / "full") == final_weights(tmp_path / "part")
    assert read_jsonl(tmp_path / "full" / "ledger.jsonl") == \
        read_jsonl(tmp_path / "part" / "ledger.jsonl")
    assert [m["step"] for m in read_jsonl(tmp_path / "part" / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.slow
def test_resume_after_sigkill_mid_iteration(ci_testbed, tmp_path):
    import signal
    import time

    common = ["--config", str(CI_CONFIG), "--no-progress", f"model={ci_testbed}",
              "backend=hf", "iterations=6", "checkpoint_every=100"]
    assert main(["es", "--out", str(tmp_path / "full"), *common]) == 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "es_llm", "es", "--out",
                             str(tmp_path / "killed"), *common], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = tmp_path / "killed" / "ledger.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ledger.is_file() and len(ledger.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(read_jsonl(ledger))
    assert 2 <= done < 6, "the run should have been killed part-way"
    # A half-written last line, as a kill during a write would leave, is dropped on resume.
    with open(ledger, "a") as f:
        f.write('{"iteration": ')
    assert main(["es", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0
    assert final_weights(tmp_path / "full") == final_weights(tmp_path / "killed")
    assert len(read_jsonl(ledger)) == 6


def test_resume_on_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["es", "--resume", str(tmp_path)]) == 2
    assert "is not an ES run folder" in capsys.readouterr().err


@pytest.mark.mpi
@pytest.mark.slow
def test_a_dead_rank_ends_the_job_in_bounded_time_naming_the_rank(ci_testbed, tmp_path):
    import re
    import time

    # Rank 1 kills itself with SIGKILL a few seconds into a long run: once the run folder
    # exists (every rank has started and named its pid), however slow the start-up was.
    wrapper = tmp_path / "die.py"
    wrapper.write_text("import os, signal, sys, threading, time\n"
                       "from es_llm.cli import main\n"
                       "def die():\n"
                       "    while not os.path.isdir(sys.argv[sys.argv.index('--out') + 1]):\n"
                       "        time.sleep(0.2)\n"
                       "    time.sleep(3.0)\n"
                       "    os.kill(os.getpid(), signal.SIGKILL)\n"
                       "if os.environ.get('PMI_RANK') == '1':\n"
                       "    threading.Thread(target=die, daemon=True).start()\n"
                       "sys.exit(main(sys.argv[1:]))\n")
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.time()
    proc = subprocess.run([mpirun, "-n", "2", sys.executable, str(wrapper), "es", "--config",
                           str(CI_CONFIG), "--out", str(tmp_path / "run"), "--no-progress",
                           f"model={ci_testbed}", "backend=hf", "iterations=1000"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert time.time() - t0 < 240  # ended by itself, long before 1000 iterations
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    # mpirun names one killed process by PID (rank 1, or rank 0 when it ends it after rank 1
    # died: which one is mpirun's choice); each rank's own line maps that PID to its rank.
    pids = dict(re.findall(r"rank (\d+)/2 is pid (\d+)", text))
    named = re.search(r"PID (\d+)", text)
    assert sorted(pids) == ["0", "1"] and named and named.group(1) in pids.values(), text[-2000:]
    assert "EXIT CODE: 9" in text  # the SIGKILL, not an error the ranks raised
