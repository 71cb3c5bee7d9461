"""The update geometry and linear connectivity sections of ``es-llm compare``: the maths on
hand-made two-tensor models with known updates, the interpolated folders, bad input, and
both sections end to end on the ci testbed."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from es_llm.cli import main
from es_llm.compare.config import CompareConfig, ConnectivityConfig, GeometryConfig
from es_llm.compare.connectivity import barrier, interpolate, pair_labels, write_interpolated
from es_llm.compare.geometry import (cosines, effective_rank, gram, moved_count, overall,
                                     singular_values, tensor_stats, top_energy,
                                     update_geometry)
from es_llm.compare.sampling import sample_model
from es_llm.compare.section import sections
from es_llm.errors import BadInput
from es_llm.io import read_jsonl
from es_llm.tasks import TaskConfig
from es_llm.testbed.standins import build_standin

# A two-tensor base model: a 4 x 3 matrix and a bias of 5.
BASE = {"w": torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10,
        "b": torch.ones(5)}
U, V = torch.tensor([1.0, 0.0, 2.0, 0.0]), torch.tensor([0.0, 3.0, 4.0])


def _folder(path, tensors):
    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def _updated(update):
    return {k: BASE[k] + update[k] for k in BASE}


def test_norms_and_moved_share_of_a_known_update():
    delta = {"w": 2 * torch.outer(U, V), "b": torch.tensor([0.0, 1e-7, 1e-3, -2.0, 0.0])}
    stats = {k: tensor_stats(BASE[k], delta[k], 1e-6, top_k=1) for k in BASE}
    # ||2 u v^T|| = 2 ||u|| ||v|| = 2 sqrt(5) 5.
    assert stats["w"]["norm"] == pytest.approx(10 * np.sqrt(5))
    assert stats["w"]["relative"] == pytest.approx(10 * np.sqrt(5) / np.linalg.norm(BASE["w"]))
    assert stats["b"]["norm"] == pytest.approx(np.hypot(1e-3, 2.0))
    assert stats["b"]["relative"] == pytest.approx(np.hypot(1e-3, 2.0) / np.sqrt(5))
    # u v^T moves the entries where both u and v are non-zero: 2 rows x 2 columns.
    assert (stats["w"]["moved"], stats["b"]["moved"]) == (4, 2)
    assert (stats["w"]["moved_share"], stats["b"]["moved_share"]) == (4 / 12, 2 / 5)
    assert "effective_rank" not in stats["b"]
    whole = overall(stats)
    assert whole["norm"] == pytest.approx(np.sqrt(500 + 1e-6 + 4))
    assert whole["relative"] == pytest.approx(whole["norm"] / np.sqrt(
        np.linalg.norm(BASE["w"]) ** 2 + 5))
    assert whole["moved_share"] == pytest.approx(6 / 17)
    assert moved_count(torch.tensor([1e-6, -1e-6, 2e-6]), 1e-6) == 1


def test_effective_rank_of_a_rank_one_and_an_identity_update():
    rank_one = singular_values(torch.outer(U, V))
    assert effective_rank(rank_one) == pytest.approx(1.0)
    assert top_energy(rank_one, 1) == pytest.approx(1.0)
    identity = singular_values(torch.eye(6))
    assert effective_rank(identity) == pytest.approx(6.0)
    assert top_energy(identity, 2) == pytest.approx(2 / 6)
    # Two directions of singular values 3 and 1: p = (3/4, 1/4).
    two = singular_values(torch.diag(torch.tensor([3.0, 1.0, 0.0])))
    p = np.array([0.75, 0.25])
    assert effective_rank(two) == pytest.approx(np.exp(-np.sum(p * np.log(p))))
    assert top_energy(two, 1) == pytest.approx(0.9)
    zero = singular_values(torch.zeros(3, 3))
    assert effective_rank(zero) is None and top_energy(zero, 1) is None


def test_cosine_of_orthogonal_and_parallel_updates():
    d = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 6.0, 0.0, 0.0], [0.0, 0.0, 5.0, -1.0]])
    cos = cosines(gram(d))
    assert cos[0, 1] == pytest.approx(1.0) and cos[0, 2] == pytest.approx(0.0)
    assert np.allclose(np.diag(cos), 1.0)


def test_update_geometry_of_hand_made_models(tmp_path):
    w = torch.outer(U, V)
    updates = {"parallel_a": {"w": w, "b": torch.zeros(5)},
               "parallel_b": {"w": 3 * w, "b": torch.zeros(5)},
               "orthogonal": {"w": torch.zeros(4, 3), "b": torch.tensor([0.0, 1, 0, 0, 0])},
               "identity": {"w": torch.eye(4, 3), "b": torch.zeros(5)}}
    folders = {"base": _folder(tmp_path / "base", BASE)}
    folders.update({name: _folder(tmp_path / name, _updated(u)) for name, u in updates.items()})
    geo = update_geometry(folders, tolerance=0.0, top_k=1)
    assert geo["tensors"] == ["b", "w"] and list(geo["models"]) == list(updates)
    models = geo["models"]
    assert models["parallel_b"]["overall"]["norm"] == pytest.approx(3 * float(w.norm()), rel=1e-6)
    assert models["parallel_a"]["tensors"]["w"]["effective_rank"] == pytest.approx(1.0)
    assert models["identity"]["tensors"]["w"]["effective_rank"] == pytest.approx(3.0)
    assert models["orthogonal"]["tensors"]["w"]["effective_rank"] is None
    assert models["orthogonal"]["overall"]["moved"] == 1
    cos = {(c["a"], c["b"]): c["cosine"] for c in geo["cosines"]}
    assert cos[("parallel_a", "parallel_b")] == pytest.approx(1.0)
    assert cos[("parallel_a", "orthogonal")] == pytest.approx(0.0)
    assert cos[("parallel_b", "orthogonal")] == pytest.approx(0.0)


def test_interpolation_gives_each_endpoint_back_exactly(tmp_path):
    a = torch.randn(64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    b = torch.randn(64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert torch.equal(interpolate(a, b, 0.0), a) and torch.equal(interpolate(a, b, 1.0), b)
    assert torch.allclose(interpolate(a, b, 0.5).float(), (a.float() + b.float()) / 2,
                          atol=1e-2)
    fa = _folder(tmp_path / "a", BASE)
    (fa / "config.json").write_text("{}")
    fb = _folder(tmp_path / "b", _updated({"w": torch.ones(4, 3), "b": torch.ones(5)}))
    for alpha, expected in ((0.0, BASE), (1.0, load_file(str(fb / "model.safetensors")))):
        out = write_interpolated(fa, fb, alpha, tmp_path / f"mid{alpha}")
        got = load_file(str(out / "model.safetensors"))
        assert all(torch.equal(got[k], expected[k]) for k in BASE)
        assert (out / "config.json").read_text() == "{}"
    half = load_file(str(write_interpolated(fa, fb, 0.5, tmp_path / "half") / "model.safetensors"))
    assert torch.allclose(half["w"], BASE["w"] + 0.5)


def test_barrier_is_the_largest_drop_below_the_line_between_the_endpoints():
    alphas = np.array([0.0, 0.5, 1.0])
    assert barrier(np.array([0.5, 0.2, 0.7]), alphas) == pytest.approx(0.4)
    assert barrier(np.array([0.2, 0.4, 0.6]), alphas) == pytest.approx(0.0)
    assert barrier(np.array([0.2, 0.9, 0.6]), alphas) == 0.0
    # Trailing axes (bootstrap resamples) are kept.
    curves = np.array([[0.5, 0.2], [0.2, 0.2], [0.7, 0.2]])
    assert barrier(curves, alphas) == pytest.approx([0.4, 0.0])


def test_settings_are_checked_and_turn_their_sections_on():
    with pytest.raises(BadInput, match=r"connectivity.alphas must lie in \[0, 1\]"):
        ConnectivityConfig(alphas=(0.0, 1.5, 1.0))
    with pytest.raises(BadInput, match="include both endpoints"):
        ConnectivityConfig(alphas=(0.0, 0.5))
    with pytest.raises(BadInput, match="entries must be A:B"):
        ConnectivityConfig(pairs=("es@0",))
    with pytest.raises(BadInput, match="connectivity.n must be at least 1"):
        ConnectivityConfig(n=0)
    with pytest.raises(BadInput, match="geometry.tolerance"):
        GeometryConfig(tolerance=-1.0)
    on = CompareConfig(geometry=GeometryConfig(enabled=True),
                       connectivity=ConnectivityConfig(pairs=("reference:es",)))
    assert [n for n, _ in sections(on)][-2:] == ["geometry", "connectivity"]
    assert "geometry" not in [n for n, _ in sections(CompareConfig())]


def test_pair_labels_read_reference_and_default_to_the_reference_against_each_model():
    names = ["base", "es@0", "grpo@0"]
    assert pair_labels(CompareConfig(), names) == [("base", "es@0"), ("base", "grpo@0")]
    cfg = CompareConfig(connectivity=ConnectivityConfig(pairs=("reference:grpo@0",
                                                               "es@0:grpo@0")))
    assert pair_labels(cfg, names) == [("base", "grpo@0"), ("es@0", "grpo@0")]
    # A reference that names a method, not one model, is no endpoint.
    with pytest.raises(BadInput, match=r"names 'base', which is no model .* here 'base'"):
        pair_labels(CompareConfig(), ["base@0", "base@1", "es@0"])


def _reshaped(folder, dest):
    """A copy of model folder ``folder`` whose first matrix has one more row."""
    shutil.copytree(folder, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    name = next(k for k, v in tensors.items() if v.dim() == 2)
    tensors[name] = torch.cat([tensors[name], tensors[name][:1]])
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def test_bad_input_is_one_paragraph_with_status_2_and_nothing_written(standin, tmp_path, capsys):
    qwen, llama = standin("qwen2"), standin("llama")
    copy = tmp_path / "copy"
    shutil.copytree(qwen, copy)
    reshaped = _reshaped(qwen, tmp_path / "reshaped")
    other_tokenizer = build_standin("qwen2", "ci", tmp_path / "other_tokenizer", seed=1)
    geometry, pairs = ["--geometry"], ["--connectivity-pairs"]
    cases = [
        ([f"base={qwen}", f"a={copy}", f"b={llama}"], geometry,
         "--geometry's models: b is a llama model"),
        ([f"base={qwen}", f"a={copy}", f"b={reshaped}"], geometry,
         r"b and a differ in 1 tensor\(s\)"),
        ([f"base={reshaped}", f"a={copy}", f"b={qwen}"], geometry,
         "reference 'base' is not the common base of the models: a and base differ"),
        ([f"base={other_tokenizer}", f"a={copy}", f"b={qwen}"], geometry,
         "a's tokenizer has another vocabulary"),
        ([f"base@0={qwen}", f"a={copy}"], geometry + ["--reference", "base"],
         "--reference must name one model among --models"),
        ([f"base={qwen}", f"a={llama}"], pairs + ["reference:a"],
         "connectivity pair base:a: a is a llama model"),
        ([f"base={qwen}", f"a={copy}"], pairs + ["a:nothing"],
         "names 'nothing', which is no model of the comparison; labels are the model names "
         r"\(base, a\) or 'reference'"),
        ([f"base={qwen}", f"a={copy}"], ["--connectivity", "--connectivity-alphas", "0", "1.5",
                                        "1"], r"must lie in \[0, 1\]"),
        ([f"base={qwen}", f"a={copy}"], ["--connectivity", "--connectivity-alphas", "0", "0.5"],
         "include both endpoints 0 and 1"),
    ]
    capsys.readouterr()  # the builds' progress bars
    for models, extra, message in cases:
        out = tmp_path / "out"
        assert main(["compare", "--models", *models, *extra, "--task", "countdown", "--n", "1",
                     "--backend", "hf", "--out", str(out), "--no-progress"]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("es-llm compare: error:") and err.count("\n") == 1, err
        assert re.search(message, err), err
        assert not out.exists()


@pytest.mark.slow
def test_both_sections_end_to_end_on_the_ci_testbed(ci_testbed, tmp_path, capsys):
    """Two perturbed copies of the ci testbed against it: the geometry of the known
    perturbations, and interpolation that reads each endpoint exactly as the model itself."""
    noise = {}
    for name, seed in (("es", 1), ("grpo", 2)):
        folder = tmp_path / name
        shutil.copytree(ci_testbed, folder)
        tensors = load_file(str(folder / "model.safetensors"))
        gen = torch.Generator().manual_seed(seed)
        noise[name] = {k: 1e-3 * torch.randn(v.shape, generator=gen).to(v.dtype)
                       for k, v in tensors.items() if v.is_floating_point()}
        save_file({k: v + noise[name].get(k, 0) for k, v in tensors.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "r"
    argv = ["compare", "--models", f"base={ci_testbed}", f"es={tmp_path / 'es'}",
            f"grpo={tmp_path / 'grpo'}", "--task", "countdown", "--n", "2", "--limit", "4",
            "--backend", "hf", "--geometry", "--connectivity-pairs", "reference:es", "es:grpo",
            "--connectivity-alphas", "0", "0.5", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    comp = json.loads((out / "comparison.json").read_text())
    base = load_file(str(ci_testbed / "model.safetensors"))
    geo = comp["geometry"]
    for name in ("es", "grpo"):
        mine = load_file(str(tmp_path / name / "model.safetensors"))
        delta = torch.cat([(mine[k].double() - base[k].double()).flatten() for k in base])
        assert geo["models"][name]["overall"]["norm"] == pytest.approx(float(delta.norm()))
    (pair,) = geo["cosines"]
    d_es, d_grpo = (torch.cat([(load_file(str(tmp_path / n / "model.safetensors"))[k].double()
                                - base[k].double()).flatten() for k in base])
                    for n in ("es", "grpo"))
    assert pair["cosine"] == pytest.approx(float(d_es @ d_grpo / d_es.norm() / d_grpo.norm()))
    assert abs(pair["cosine"]) < 0.1  # independent noise: nearly orthogonal
    con = comp["connectivity"]
    assert con["n"] == 2  # connectivity.n unset: the comparison's own n
    assert con["alphas"] == [0.0, 0.5, 1.0] and [(p["a"], p["b"]) for p in con["pairs"]] == [
        ("base", "es"), ("es", "grpo")]
    root = out / "samples" / "connectivity"

    def completions(folder):
        return [(r["problem_id"], r["completion"], r["correct"])
                for r in read_jsonl(folder / "samples.jsonl")]

    # Sampled reads at the ends are the comparison's own samples of the endpoint models.
    for pair_folder, alpha, model in (("base_to_es", 0, "base"), ("base_to_es", 1, "es"),
                                      ("es_to_grpo", 0, "es"), ("es_to_grpo", 1, "grpo")):
        assert completions(root / pair_folder / f"alpha_{alpha}" / "pass1") == completions(
            out / "samples" / model)
    # Greedy reads at the ends are the endpoint models' own greedy reads.
    data = str(ci_testbed / "data" / "countdown_eval.jsonl")
    cfg = CompareConfig(task=TaskConfig(name="countdown", limit=4, data=data), backend="hf")
    greedy = replace(cfg, sampling=replace(cfg.sampling, n=1, temperature=0.0))
    for pair_folder, alpha, model in (("base_to_es", 0, ci_testbed),
                                      ("es_to_grpo", 1, tmp_path / "grpo")):
        own = sample_model("own", model, greedy, tmp_path / "own" / model.name, False)
        assert completions(root / pair_folder / f"alpha_{alpha}" / "greedy") == completions(own)
    for p in con["pairs"]:
        for key in ("greedy", "pass@1"):
            assert p[key]["barrier"] >= 0 and p[key]["ci95"][0] <= p[key]["barrier"] + 1e-12
    report = (out / "report.md").read_text()
    assert "## Update geometry" in report and "## Linear connectivity" in report
    assert (out / "figures" / "geometry.png").stat().st_size > 0
    assert (out / "figures" / "connectivity.png").stat().st_size > 0
    # theta(alpha) is removed once read, and a rerun reads none of the 3 points of the 2
    # pairs again (greedy and sampled): their samples name the same model folder.
    assert not list(root.glob("*/alpha_*/model"))
    capsys.readouterr()
    assert main(argv) == 0
    reused = [line for line in capsys.readouterr().out.splitlines()
              if " at " in line and "reusing" in line]
    assert len(reused) == 2 * 3 * 2, reused
    assert json.loads((out / "comparison.json").read_text())["connectivity"] == con
