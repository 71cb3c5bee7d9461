"""The testbed's masked-diffusion model: its objective by hand, a deterministic cached build
that the Auto classes load, and `es-llm eval` and `es-llm es` running on it."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from es_llm.cli import main
from es_llm.io import read_jsonl
from es_llm.testbed.diffusion import canvas_batch, masked_diffusion_loss
from es_llm.testbed.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]


class Uniform(torch.nn.Module):
    """Equal logits everywhere: every masked token costs exactly log V."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": torch.zeros(*input_ids.shape, self.vocab)})()


def test_canvas_rows_hold_prompt_completion_and_eos_fill():
    tok = build_tokenizer()
    ids, attention, canvas = canvas_batch([("ab\n", "xy"), ("a\n", "z")], tok, 4)
    bos, eos, pad = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    a, b, x, y, z, nl = (tok.convert_tokens_to_ids(c) for c in "abxyz\n")
    assert ids.tolist() == [[bos, a, b, nl, x, y, eos, eos], [bos, a, nl, z, eos, eos, eos, pad]]
    assert attention[1].tolist() == [1] * 7 + [0]
    assert canvas[0].tolist() == [False] * 4 + [True] * 4
    assert canvas[1].tolist() == [False] * 3 + [True] * 4 + [False]


class Oracle(torch.nn.Module):
    """Logit 10 on the true token at each position (whatever the input), 0 elsewhere."""

    def __init__(self, ids, vocab: int):
        super().__init__()
        self.ids, self.vocab = ids, vocab

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": 10.0 * torch.nn.functional.one_hot(
            self.ids, self.vocab).float()})()


def test_masked_diffusion_loss_is_the_mean_over_masked_tokens():
    tok = build_tokenizer()
    ids, attention, canvas = canvas_batch([("ab\n", "xyxy"), ("a\n", "z")], tok, 8)
    V = len(tok)
    # Uniform logits: every masked token costs exactly log V, whatever was masked.
    loss = masked_diffusion_loss(Uniform(V), ids, attention, canvas, tok.mask_token_id,
                                 torch.Generator().manual_seed(3))
    assert loss.item() == pytest.approx(math.log(V), rel=1e-6)
    # A model that knows every token: -log(e^10 / (e^10 + V - 1)) per token.
    loss = masked_diffusion_loss(Oracle(ids, V), ids, attention, canvas, tok.mask_token_id,
                                 torch.Generator().manual_seed(3))
    assert loss.item() == pytest.approx(math.log1p((V - 1) * math.exp(-10)), rel=1e-3)


def test_ci_diffusion_model_is_built_loads_with_auto_classes_and_reports(ci_diffusion):
    folder = ci_diffusion / "diffusion"
    model = AutoModelForMaskedLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == "BertForMaskedLM"
    assert tok.mask_token == "<mask>" and tok.get_vocab() == AutoTokenizer.from_pretrained(
        ci_diffusion).get_vocab()
    sampling = json.loads((folder / "diffusion_sampling.json").read_text())
    assert sampling["gen_length"] % sampling["block_length"] == 0
    info = json.loads((ci_diffusion / "testbed.json").read_text())["diffusion"]
    assert info["path"] == "diffusion" and 0 <= info["report"]["pass@1"] <= 1
    assert (folder / "data" / "countdown_eval.jsonl").is_file()


def test_eval_runs_the_diffusion_model_with_its_sampler(ci_diffusion, tmp_path):
    out = tmp_path / "ev"
    assert main(["eval", "--model", str(ci_diffusion / "diffusion"), "--task", "countdown",
                 "--n", "2", "--limit", "6", "--out", str(out), "--no-progress"]) == 0
    rows = read_jsonl(out / "samples.jsonl")
    assert len(rows) == 12 and all("<mask>" not in r["completion"] for r in rows)
    assert json.loads((out / "metrics.json").read_text())["config"]["backend"] == "diffusion"
    assert main(["eval", "--model", str(ci_diffusion / "diffusion"), "--backend", "vllm",
                 "--n", "1", "--limit", "1", "--out", str(tmp_path / "v"), "--no-progress"]) == 2


@pytest.mark.slow
def test_es_evolves_the_diffusion_model_and_its_checkpoint_decodes(ci_diffusion, tmp_path):
    run = tmp_path / "es"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "es_llm", "es", "--config", str(ROOT / "configs" / "es_countdown_ci.yaml"),
         "--out", str(run), "--no-progress", f"model={ci_diffusion / 'diffusion'}", "iterations=2",
         "es.population=4", "prompts_per_iteration=8", "backend=auto",
         # The ci diffusion model rarely solves a problem; the format share of the reward
         # gives the population a signal to move on.
         "task.format_weight=0.5"],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = run / "checkpoints" / "final"
    assert (final / "diffusion_sampling.json").is_file()
    digest = lambda p: hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    assert digest(final) != digest(ci_diffusion / "diffusion")
    metrics = read_jsonl(run / "metrics.jsonl")
    assert len(metrics) == 2 and any(m["es/reward_std"] > 0 for m in metrics)
    assert main(["eval", "--model", str(final), "--n", "1", "--limit", "3", "--out",
                 str(tmp_path / "ev"), "--no-progress"]) == 0
