"""evotorch's algorithms in `es-llm es` (es.algorithm): the update is evotorch's own on the
fitnesses the run recorded, a resume replays them bitwise, two MPI ranks give the serial
run, PGPE raises a reward whose optimum is known, and a search that cannot fit is refused
with its size."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from es_llm.adapters import LoraSettings
from es_llm.cli import main
from es_llm.comm.serial import SerialComm
from es_llm.es.config import ESRunConfig
from es_llm.es.engine import run
from es_llm.es.evotorch_loop import EVOTORCH, flatten, unflatten
from es_llm.es.setup import build_edges
from es_llm.io import read_jsonl
from es_llm.models import resolve_training_data
from es_llm.tasks import TaskConfig
from populations.es import ESConfig
from test_es_direction import greedy_reward, sevens_task  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]
CI_CONFIG = ROOT / "configs" / "es_countdown_ci.yaml"
# One small matrix of the ci model evolves: 32 x 32 = 1,024 parameters.
SMALL = ["engine.params=regex", r"engine.param_pattern=layers\.0\.self_attn\.o_proj\.weight"]
PGPE = ["es.algorithm=pgpe", "es.population=8", "es.sigma=0.05", "es.lr=0.02", "backend=hf",
        "prompts_per_iteration=4", "max_tokens=16", "checkpoint_every=100",
        "checksum_every=1"]
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


def es(ci_testbed, out, *extra) -> int:
    return main(["es", "--config", str(CI_CONFIG), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}", *PGPE, *SMALL, *extra])


def evolved(folder: Path) -> torch.Tensor:
    return load_file(str(folder / "model.safetensors"))[
        "model.layers.0.self_attn.o_proj.weight"]


def test_flatten_and_unflatten_are_inverse():
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([7.0])}
    flat = flatten(tensors)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7]
    back = unflatten(flat, tuple((n, t.shape) for n, t in tensors.items()))
    assert all(torch.equal(back[n], tensors[n]) for n in tensors)


def test_the_update_is_evotorchs_own_on_the_recorded_fitnesses(ci_testbed, tmp_path):
    from evotorch import Problem
    from evotorch.algorithms import PGPE as EvotorchPGPE
    from safetensors.torch import load_file as load

    out = tmp_path / "run"
    assert es(ci_testbed, out, "iterations=4") == 0
    ledger = read_jsonl(out / "ledger.jsonl")
    assert [e["algorithm"] for e in ledger] == ["pgpe"] * 4
    base = load(str(ci_testbed / "model.safetensors"))["model.layers.0.self_attn.o_proj.weight"]
    fitnesses = iter(torch.tensor(e["fitness_N"], dtype=torch.float32) for e in ledger)
    problem = Problem("max", lambda values: next(fitnesses), solution_length=base.numel(),
                      dtype=torch.float32, seed=0, vectorized=True, initial_bounds=(-1, 1))
    search = EvotorchPGPE(problem, popsize=8, center_init=base.reshape(-1).float(),
                          stdev_init=0.05, center_learning_rate=0.02, stdev_learning_rate=0.1)
    for _ in ledger:
        search.step()
    expected = torch.tensor(search.status["center"].tolist()).reshape(base.shape)
    final = evolved(out / "checkpoints" / "final")
    assert not torch.equal(final, base)
    assert torch.equal(final, expected)


def test_resume_replays_the_recorded_fitnesses_bitwise(ci_testbed, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert es(ci_testbed, whole, "iterations=4") == 0
    assert es(ci_testbed, cut, "iterations=2") == 0
    assert main(["es", "--resume", str(cut), "--no-progress", "iterations=4"]) == 0
    assert read_jsonl(cut / "ledger.jsonl") == read_jsonl(whole / "ledger.jsonl")
    assert torch.equal(evolved(cut / "checkpoints" / "final"),
                       evolved(whole / "checkpoints" / "final"))


@pytest.mark.mpi
@pytest.mark.slow
def test_two_ranks_give_bitwise_the_serial_search(ci_testbed, tmp_path):
    serial = tmp_path / "serial"
    assert es(ci_testbed, serial, "iterations=3") == 0
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([mpirun, "-n", "2", sys.executable, "-m", "es_llm", "es", "--config",
                           str(CI_CONFIG), "--out", str(tmp_path / "mpi"), "--no-progress",
                           f"model={ci_testbed}", *PGPE, *SMALL, "iterations=3"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_jsonl(tmp_path / "mpi" / "ledger.jsonl") == read_jsonl(serial / "ledger.jsonl")
    assert torch.equal(evolved(tmp_path / "mpi" / "checkpoints" / "final"),
                       evolved(serial / "checkpoints" / "final"))


@pytest.mark.slow
def test_pgpe_raises_a_reward_whose_optimum_is_known(ci_testbed, tmp_path, sevens_task):
    # "Write the digit 7": the optimum (reward 1) is a completion of sevens only.
    cfg = ESRunConfig(model=str(ci_testbed),
                      task=TaskConfig(name="sevens",
                                      data=str(ci_testbed / "data" / "countdown_rl.jsonl")),
                      es=ESConfig(algorithm="pgpe", population=16, sigma=0.1, lr=2.0),
                      # A tiny adapter: rank 2 on the attention projections.
                      lora=LoraSettings(enabled=True, rank=2, alpha=4.0),
                      iterations=20, prompts_per_iteration=32, max_tokens=32, backend="hf",
                      checkpoint_every=100)
    edges, problems = build_edges(resolve_training_data(cfg), SerialComm())
    held = problems[:64]
    before = greedy_reward(edges, held)
    run(cfg, edges, problems, tmp_path / "run", progress=False, search=EVOTORCH)
    after = greedy_reward(edges, held)
    print(f"greedy reward before {before:.3f} after {after:.3f}")
    # From 0.008 to 0.90 when written; the optimum is 1.
    assert after > before + 0.3, (before, after)


@pytest.mark.parametrize("extra, words", [
    (["es.algorithm=cmaes", "engine.params=all"], "GiB"),
    (["es.algorithm=nes"], "valid choices are: es, cem, cmaes, pgpe, snes"),
    (["es.kind=lowrank"], "set es.kind=full and engine.serve=weights"),
    (["es.population=7"], "needs an even population"),
])
def test_bad_settings_exit_2_and_write_nothing(ci_testbed, tmp_path, capsys, extra, words):
    out = tmp_path / "run"
    assert es(ci_testbed, out, *extra) == 2
    assert words in capsys.readouterr().err.replace("\n", " ")
    assert not out.exists()


def test_probe_sigma_is_for_the_own_es(ci_testbed, tmp_path, capsys):
    assert es(ci_testbed, tmp_path / "run", "--probe-sigma", "0.01") == 2
    assert "mirrored pairs of es-llm's own ES" in capsys.readouterr().err.replace("\n", " ")
