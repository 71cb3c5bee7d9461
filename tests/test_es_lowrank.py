"""Low-rank ES on the ci testbed: a member served as per-row terms equals the model with its
weights written, rows and weights serving give the same run, `mpirun -n 2` and SIGKILL +
resume reproduce one process bitwise, bad settings exit 2, and a dense reward rises."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from es_llm.backends.base import SamplingParams
from es_llm.backends.hf import HFBackend
from es_llm.backends.lowrank_rows import RowAdapters
from es_llm.cli import main
from es_llm.errors import BadInput
from es_llm.es.weights import ModuleWeights
from es_llm.io import read_jsonl
from populations import lowrank
from populations.perturbations import KindInput, perturbation

ROOT = Path(__file__).resolve().parents[1]
LOWRANK = ROOT / "configs" / "es_countdown_lowrank_ci.yaml"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def prompts(ci_testbed, n):
    rows = (ci_testbed / "data" / "countdown_rl.jsonl").read_text().splitlines()[:n]
    return [json.loads(r)["prompt"] for r in rows]


def test_a_member_in_rows_equals_its_written_weights(ci_testbed):
    model = AutoModelForCausalLM.from_pretrained(ci_testbed)
    tok = AutoTokenizer.from_pretrained(ci_testbed)
    names = [n for n, _ in model.named_parameters()]
    rows = RowAdapters(model, names)
    backend = HFBackend(str(ci_testbed), model=model, tokenizer=tok)
    rank, sigma, k = 2, 0.05, 2
    members = [(0, 1), (0, -1), (5, 1)]
    shapes = {n: p.shape for n, p in model.named_parameters()}
    A = {n: torch.stack([lowrank.factors(3, 1, d, n, shapes[n], rank)[0] * (s * sigma / math.sqrt(rank))
                         for d, s in members]) for n in rows.matrices}
    B = {n: torch.stack([lowrank.factors(3, 1, d, n, shapes[n], rank)[1] for d, s in members])
         for n in rows.matrices}
    texts = prompts(ci_testbed, k)
    batch = [p for _ in members for p in texts]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=40)
    ids = tok(texts[0], return_tensors="pt").input_ids
    with torch.no_grad(), rows.members(A, B, k):
        served = backend.generate(batch, params)
        logits_rows = model(input_ids=ids.repeat(len(members) * k, 1)).logits
    pert = perturbation("lowrank", KindInput(3, 1, rank=rank))
    weights = ModuleWeights(model, names)
    differs = 0
    for i, (d, s) in enumerate(members):
        weights.perturb(lambda name, shape, d=d: pert.dense(d, name, shape), s, sigma)
        written = backend.generate(texts, params)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        weights.restore()
        for j in range(k):
            assert served[i * k + j][0].token_ids == written[j][0].token_ids
        assert (logits - logits_rows[i * k]).abs().max() < 1e-5
        differs += served[i * k][0].token_ids != backend.generate(texts, params)[0][0].token_ids
    # The perturbation is large enough to change what the model writes.
    assert differs > 0


def test_rows_cannot_serve_a_matrix_outside_linear_and_embedding_layers():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.zeros(3, 4))
            self.proj = torch.nn.Linear(4, 4)

    with pytest.raises(BadInput, match="table is neither"):
        RowAdapters(Odd(), ["table", "proj.weight"])


def es_cli(*args, ranks: int = 1) -> subprocess.CompletedProcess:
    prefix = []
    if ranks > 1:
        mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
        prefix = [mpirun, "-n", str(ranks)]
    return subprocess.run([*prefix, sys.executable, "-m", "es_llm", "es", "--no-progress", *args],
                          capture_output=True, text=True, env=ENV, timeout=600)


def final_weights(out: Path) -> bytes:
    return (out / "checkpoints" / "final" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def serial_rows_run(ci_testbed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lowrank") / "run"
    done = es_cli("--config", str(LOWRANK), "--out", str(out), f"model={ci_testbed}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_lowrank_run_folder_and_diagnostics(serial_rows_run):
    ledger = read_jsonl(serial_rows_run / "ledger.jsonl")
    metrics = read_jsonl(serial_rows_run / "metrics.jsonl")
    assert len(ledger) == 4 and len(ledger[0]["members"]) == 64
    # Each pair on its own 4 prompts of the 16: pair j from index 4 j, wrapping.
    assert ledger[0]["prompts_N_P"][0] == [0, 1, 2, 3] == ledger[0]["prompts_N_P"][1]
    assert ledger[0]["prompts_N_P"][8] == [0, 1, 2, 3] and ledger[0]["prompts_N_P"][2] == [4, 5, 6, 7]
    assert metrics[-1]["samples/generated"] == 4 * 64 * 4
    for m in metrics:
        for key in ("es/pairs_reward_differs", "es/pairs_same_text", "es/pairs_correct_differs",
                    "es/pairs_format_differs"):
            assert 0.0 <= m[key] <= 1.0
        # A pair with different rewards wrote different texts.
        assert m["es/pairs_reward_differs"] + m["es/pairs_same_text"] <= 1.0
    assert any(m["es/pairs_reward_differs"] > 0 for m in metrics)
    assert "kind: lowrank" in (serial_rows_run / "config.yaml").read_text()


@pytest.mark.slow
def test_rows_and_written_weights_give_the_same_run(ci_testbed, tmp_path, serial_rows_run):
    out = tmp_path / "weights"
    done = es_cli("--config", str(LOWRANK), "--out", str(out), f"model={ci_testbed}",
                  "engine.serve=weights", "iterations=2", "checkpoint_every=100")
    assert done.returncode == 0, done.stderr[-3000:]
    # The same greedy texts, so the same rewards: the two servings are one perturbation.
    assert read_jsonl(out / "ledger.jsonl") == read_jsonl(serial_rows_run / "ledger.jsonl")[:2]


@pytest.mark.mpi
@pytest.mark.slow
def test_lowrank_mpirun_two_ranks_gives_bitwise_the_serial_weights(ci_testbed, tmp_path,
                                                                    serial_rows_run):
    two = es_cli("--config", str(LOWRANK), "--out", str(tmp_path / "two"), f"model={ci_testbed}",
                 ranks=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert read_jsonl(tmp_path / "two" / "ledger.jsonl") == read_jsonl(serial_rows_run / "ledger.jsonl")
    assert final_weights(tmp_path / "two") == final_weights(serial_rows_run)


@pytest.mark.slow
def test_lowrank_resume_after_sigkill_is_bitwise(ci_testbed, tmp_path):
    common = ["--config", str(LOWRANK), f"model={ci_testbed}", "iterations=8",
              "checkpoint_every=100", "es.optimizer=adam"]
    assert es_cli("--out", str(tmp_path / "full"), *common).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "es_llm", "es", "--no-progress", "--out",
                             str(tmp_path / "killed"), *common], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = tmp_path / "killed" / "ledger.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ledger.is_file() and len(ledger.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 3 <= len(read_jsonl(ledger)) < 8, "the run should have been killed part-way"
    assert main(["es", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0
    assert final_weights(tmp_path / "full") == final_weights(tmp_path / "killed")
    assert read_jsonl(ledger) == read_jsonl(tmp_path / "full" / "ledger.jsonl")


@pytest.mark.parametrize("override, message", [
    ("es.rank=0", "config key 'es.rank': rank must be an int >= 1"),
    ("es.rank=33", "es.rank=33 is above the rank"),
    ("engine.prompts_per_member=17", "does not fit the batch of prompts_per_iteration=16"),
    ("es.population=63", "needs an even population size"),
    ("es.kind=full", "engine.serve=rows needs es.kind=lowrank"),
    ("es.vectors=full", "engine.serve=rows perturbs matrices only"),
    ("es.shaping=pair_diff es.antithetic=false", "config key 'es.shaping': shaping pair_diff"),
    ("engine.members_per_call=3", "engine.members_per_call must be even with es.antithetic"),
    ("backend=vllm", "engine.serve=rows runs the population inside the HF decoding loop"),
    ("es.kind=tiny", "config key 'es.kind': unknown kind 'tiny'"),
])
def test_lowrank_bad_settings_exit_2(ci_testbed, tmp_path, capsys, override, message):
    code = main(["es", "--config", str(LOWRANK), "--out", str(tmp_path / "never"),
                 f"model={ci_testbed}", *override.split()])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_probe_sigma_reports_pair_diagnostics_and_writes_no_run(ci_testbed, tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["es", "--config", str(LOWRANK), "--out", str(out), f"model={ci_testbed}",
                 "--probe-sigma", "0.0001,0.05"]) == 0
    rows = json.loads((out / "probe_sigma.json").read_text())
    assert [r["sigma"] for r in rows] == [0.0001, 0.05]
    # A tiny sigma leaves most mirrored pairs writing the same texts; a large one does not.
    assert rows[0]["pairs_same_text"] > rows[1]["pairs_same_text"]
    for r in rows:
        assert r["pairs_reward_differs"] + r["pairs_same_text"] <= 1.0
    assert sorted(p.name for p in out.iterdir()) == ["probe_sigma.json"]
    assert "pairs_correct_differs" in capsys.readouterr().out
    assert main(["es", "--config", str(LOWRANK), "--out", str(tmp_path / "bad"),
                 f"model={ci_testbed}", "--probe-sigma", "0.01,-1"]) == 2


def test_a_bf16_run_logs_the_realised_update_cosine(ci_testbed, tmp_path):
    out = tmp_path / "bf16"
    assert main(["es", "--config", str(LOWRANK), "--out", str(out), "--no-progress",
                 f"model={ci_testbed}", "runtime.dtype=bfloat16", "iterations=2",
                 "checkpoint_every=100", "es.lr=0.0005"]) == 0
    cosines = [m["es/realised_cosine"] for m in read_jsonl(out / "metrics.jsonl")]
    # bf16 rounding loses part of a small update, never all of it at this lr.
    assert all(0.0 < c < 1.0 for c in cosines), cosines


def test_rows_wrap_and_restore_a_forward_set_on_the_instance():
    """A forward already set on a layer (accelerate's offloading hooks set one) still runs
    under the member term and is put back afterwards."""
    layer = torch.nn.Linear(3, 2)
    calls = []

    def own(x):
        calls.append(1)
        return torch.nn.Linear.forward(layer, x)

    layer.forward = own
    class Tiny(torch.nn.Sequential):
        def forward(self, input_ids):
            return super().forward(input_ids)

    model = Tiny(torch.nn.Embedding(5, 3), layer)
    rows = RowAdapters(model, ["1.weight"])
    A = {"1.weight": torch.ones(1, 2, 1)}
    B = {"1.weight": torch.ones(1, 3, 1)}
    ids = torch.tensor([[1, 2]])
    with torch.no_grad():
        base = model(ids)
        calls.clear()
        with rows.members(A, B, 1):
            served = model(ids)
        assert calls == [1]
        x = model[0](ids)
        torch.testing.assert_close(served, base + x.sum(-1, keepdim=True).expand(-1, -1, 2))
    assert layer.forward is own
