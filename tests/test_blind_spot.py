"""The blind-spot diagnostic: grafts by hand on the ci testbed (coefficient 0 is exact
greedy, each graft changes the residual stream only where it says), the donors of each
kind, and the compare section end to end with its bad input."""

from __future__ import annotations

import json
import random
import re
import shutil

import pytest
import torch

from es_llm.backends.base import SamplingParams
from es_llm.backends.grafting import (align_donor, check_layer, decoder_layers, grafted,
                                      layer_activations, mix)
from es_llm.cli import main
from es_llm.compare.blind_spot import reordered
from es_llm.io import read_jsonl


@pytest.fixture(scope="module")
def backend(ci_testbed):
    from es_llm.backends.hf import HFBackend

    return HFBackend(str(ci_testbed))


PROMPT = "nums 10 4 5 3 make 37\n"


def test_a_graft_with_coefficient_0_is_exactly_greedy(backend):
    params = SamplingParams(n=1, temperature=0.0, max_tokens=24)
    plain = backend.generate([PROMPT] * 4, params)
    ids = backend.tokenizer(PROMPT).input_ids
    donors = torch.randn(4, len(ids), backend.model.config.hidden_size,
                         generator=torch.Generator().manual_seed(0))
    with grafted(backend.model, 0, donors, [0.0] * 4, slice(0, len(ids))):
        same = backend.generate([PROMPT] * 4, params)
    assert [o[0].token_ids for o in same] == [o[0].token_ids for o in plain]
    with grafted(backend.model, 0, donors * 50, [1.0] * 4, slice(0, len(ids))):
        moved = backend.generate([PROMPT] * 4, params)
    assert [o[0].token_ids for o in moved] != [o[0].token_ids for o in plain]


def _outputs(model, ids):
    """Every decoder layer's output for one prompt."""
    seen = []
    handles = [layer.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
               for layer in decoder_layers(model)]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids] * 2))
    finally:
        for h in handles:
            h.remove()
    return seen


def test_a_graft_changes_its_layer_on_its_span_only(backend):
    model = backend.model
    ids = backend.tokenizer(PROMPT).input_ids
    T, H = len(ids), model.config.hidden_size
    before = _outputs(model, ids)
    donors = torch.randn(2, T, H, generator=torch.Generator().manual_seed(1))
    span = slice(2, 6)
    with grafted(model, 1, donors, [0.5, 0.0], span):
        after = _outputs(model, ids)
    assert torch.equal(after[0], before[0])            # the layer below: untouched
    h, g = before[1], after[1]
    assert torch.equal(g[:, :2], h[:, :2]) and torch.equal(g[:, 6:], h[:, 6:])
    torch.testing.assert_close(g[0, span], h[0, span] + 0.5 * (donors[0, span] - h[0, span]))
    assert torch.equal(g[1], h[1])                      # row 1 has coefficient 0
    assert check_layer(model, -1) == 1
    with pytest.raises(ValueError, match="out of range"):
        check_layer(model, 2)


def test_mix_and_donor_alignment_by_hand():
    h = torch.zeros(1, 3, 2)
    d = torch.ones(1, 2, 2) * 4
    out = mix(h, d, torch.tensor([0.25]), slice(1, 3))
    assert out[0].tolist() == [[0, 0], [1, 1], [1, 1]]
    donor = torch.tensor([[1.0], [2.0]])
    assert align_donor(donor, 4)[:, 0].tolist() == [1.0, 2.0, 2.0, 2.0]
    assert align_donor(donor, 1)[:, 0].tolist() == [1.0]


def test_each_kind_has_its_donor(backend):
    text = reordered(PROMPT, random.Random(0))
    assert text != PROMPT and sorted(text.split()[1:5]) == sorted(PROMPT.split()[1:5])
    assert text.split()[5:] == PROMPT.split()[5:]
    with pytest.raises(ValueError, match="not a Countdown prompt"):
        reordered("write a poem", random.Random(0))
    model, tok = backend.model, backend.tokenizer
    a = layer_activations(model, tok(PROMPT).input_ids, 0)
    b = layer_activations(model, tok(text).input_ids, 0)
    assert a.shape == b.shape and not torch.equal(a, b)  # the same length, other values


def test_each_kind_grafts_its_own_donor(backend):
    """The six chains of one problem: row j of the layer's output is h + c_j (d_j - h) with
    d_j the kind's donor (its own activations for greedy, the reordered prompt's, the mean
    activation, another prompt's), on every prompt position."""
    from es_llm.compare.blind_spot import CHAINS, BlindSpotConfig, _donors

    model, tok = backend.model, backend.tokenizer
    prompts = [PROMPT, "nums 2 7 9 make 23\n", "nums 1 5 6 8 make 40\n"]
    cfg = BlindSpotConfig(layer=1)
    mean_H = torch.cat([layer_activations(model, tok(p).input_ids, 1) for p in prompts]).mean(0)
    donors, coefs = _donors(model, tok, prompts, 0, tok(prompts[0]).input_ids, mean_H, 1, cfg,
                            seed=0)
    ids = tok(PROMPT).input_ids
    T = len(ids)
    own = layer_activations(model, ids, 1)
    text = reordered(PROMPT, random.Random("0:reorder:0:1"))
    expected = {"greedy": own, "mean": mean_H[None].expand(T, -1),
                "reorder": align_donor(layer_activations(model, tok(text).input_ids, 1), T)}
    assert coefs == [0.0, cfg.reorder_coef, cfg.reorder_coef, cfg.mean_coef, cfg.mix_coef,
                     cfg.mix_coef]
    torch.testing.assert_close(donors[0], expected["greedy"])
    torch.testing.assert_close(donors[1], expected["reorder"])
    torch.testing.assert_close(donors[3], expected["mean"])
    other = prompts[(0 + 4) % 3]
    torch.testing.assert_close(donors[4], align_donor(
        layer_activations(model, tok(other).input_ids, 1), T))
    seen = []
    with grafted(model, 1, donors, coefs, slice(0, T)), torch.no_grad():
        # Registered after the graft's hook, so it sees the grafted output.
        handle = decoder_layers(model)[1].register_forward_hook(
            lambda m, a, out: seen.append(out.detach().clone()))
        try:
            model(input_ids=torch.tensor([ids] * len(CHAINS)))
        finally:
            handle.remove()
    for j, c in enumerate(coefs):
        torch.testing.assert_close(seen[0][j], own + c * (donors[j] - own))
    assert not torch.equal(seen[0][1], own) and not torch.equal(seen[0][3], own)


@pytest.mark.slow
def test_compare_blind_spot_on_the_ci_testbed(ci_testbed, tmp_path, capsys):
    model = tmp_path / "copy"
    shutil.copytree(ci_testbed, model)
    out = tmp_path / "r"
    base = ["compare", "--models", f"base={ci_testbed}", f"copy={model}", "--task", "countdown",
            "--n", "6", "--limit", "12", "--backend", "hf", "--max-tokens", "32"]
    assert main([*base, "--blind-spot", "blind_spot.max_problems=4", "--out", str(out),
                 "--no-progress"]) == 0
    comp = json.loads((out / "comparison.json").read_text())
    spot = comp["blind_spot"]
    md = (out / "report.md").read_text()
    assert "## The pass@k blind spot" in md and "(figures/blind_spot.png)" in md
    for name in ("base", "copy"):
        m = spot["models"][name]
        rows = read_jsonl(out / "samples" / name / "samples.jsonl")
        never = {pid for pid in {r["problem_id"] for r in rows}
                 if not any(r["correct"] for r in rows if r["problem_id"] == pid)}
        assert m["never_solved"] == len(never) and m["diagnosed"] == min(4, len(never))
        assert m["greedy"] <= m["recovered"] <= m["diagnosed"]
        assert set().union(*map(set, m["fix_sets"].values())) <= never
        assert m["chain_tokens"] > 0 and m["sample_tokens"] > 0
        assert re.search(rf"\| {name} \| {m['never_solved']} \| {m['diagnosed']} \| "
                         rf"{m['greedy']} ", md)
        for pair, value in m["jaccard"].items():
            a, b = (set(m["fix_sets"][k]) for k in pair.split("|"))
            assert value == (len(a & b) / len(a | b) if a | b else None)
    # The same weights read the same way: identical figures for the two folders.
    assert spot["models"]["base"]["fix_sets"] == spot["models"]["copy"]["fix_sets"]
    capsys.readouterr()
    for extra, message in ((["blind_spot.k=8"], "at least blind_spot.k=8 samples"),
                           (["blind_spot.layer=5"], "blind_spot.layer=5 is out of range"),
                           (["--task", "arithmetic"], "needs task countdown")):
        bad = tmp_path / "bad"
        assert main([*base, "--blind-spot", *extra, "--out", str(bad), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not bad.exists()


def test_blind_spot_refuses_a_diffusion_model(ci_diffusion, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["compare", "--models", f"base={ci_diffusion / 'diffusion'}", "--task",
                 "countdown", "--n", "6", "--blind-spot", "--out", str(out),
                 "--no-progress"]) == 2
    assert "masked-diffusion model" in capsys.readouterr().err and not out.exists()
