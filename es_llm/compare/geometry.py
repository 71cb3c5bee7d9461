"""Update geometry (``es-llm compare --geometry``): what each trained model did to the weights
of its base, the comparison's reference.

Per model folder and tensor, with Delta W = W_trained - W_reference: the Frobenius norm
||Delta W||, the relative size ||Delta W|| / ||W||, the share of entries that moved by more
than ``geometry.tolerance``; for every matrix, the effective rank of Delta W (Roy &
Vetterli 2007: the exponential of the Shannon entropy of its singular values normalised to
sum to 1; 1 for a rank-one update, n for an n x n identity) and the share of its energy
(sum of squared singular values) in the ``geometry.top_k`` leading ones. Overall, the same
norms over every tensor at once, and the cosine between every two models' updates flattened
into one vector.

arXiv 2604.01499 reports that on Qwen3-4B ES and GRPO reach similar accuracy
along nearly orthogonal update directions, ES moving the weights much further; the cosine
between seeds of one method is the noise floor such a claim is read against.

Weights are read tensor by tensor from the safetensors files, so no model is ever loaded
whole. The comparison section ``geometry`` (enabled by ``geometry.enabled``) is at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
from scipy.stats import entropy

from es_llm.compare.section import (SECTIONS, CheckInput, Section, SectionInput, fields_dict,
                                    model_folder)
from es_llm.config import to_dict
from es_llm.errors import BadInput
from es_llm.report import Figure, Heading, Paragraph, Table, number, pct, pyplot, save_figure


# --- the maths, on tensors ---------------------------------------------------------------------

def frobenius(W_any: torch.Tensor) -> float:
    """||W||_F of a tensor of any shape (the 2-norm of its entries), in float64."""
    return float(torch.linalg.vector_norm(W_any.double()))


def moved_count(delta_any: torch.Tensor, tolerance: float) -> int:
    """How many entries of an update ``delta_any`` (any shape) moved by more than
    ``tolerance``."""
    return int((delta_any.abs() > tolerance).sum())


def singular_values(delta_M_N: torch.Tensor) -> np.ndarray:
    """``s_K``: the singular values of a matrix update, largest first (K = min(M, N))."""
    return torch.linalg.svdvals(delta_M_N.double()).numpy()


def effective_rank(s_K: np.ndarray) -> float | None:
    """Effective rank exp(H(p)) of a matrix with singular values ``s_K``, p = s / sum(s)
    (Roy & Vetterli 2007); None for a zero matrix, which has no spectrum to spread."""
    total = float(np.sum(s_K))
    return float(np.exp(entropy(s_K / total))) if total > 0 else None


def top_energy(s_K: np.ndarray, k: int) -> float | None:
    """The share of sum(s^2) (the squared Frobenius norm) in the k largest singular values of
    ``s_K`` (sorted largest first); None for a zero matrix."""
    energy_K = np.square(s_K)
    total = float(energy_K.sum())
    return float(energy_K[:k].sum() / total) if total > 0 else None


def gram(deltas_C_N: torch.Tensor) -> np.ndarray:
    """``G_C_C``: the dot products of C flattened updates (rows), in float64."""
    d = deltas_C_N.double()
    return (d @ d.T).numpy()


def cosines(gram_C_C: np.ndarray) -> np.ndarray:
    """``cos_C_C`` from a Gram matrix: G_ij / sqrt(G_ii G_jj); NaN where an update is zero."""
    norms_C = np.sqrt(np.diag(gram_C_C))
    with np.errstate(invalid="ignore", divide="ignore"):
        return gram_C_C / np.outer(norms_C, norms_C)


def tensor_stats(W_any: torch.Tensor, delta_any: torch.Tensor, tolerance: float,
                 top_k: int) -> dict:
    """One tensor's update ``delta_any`` against its base ``W_any`` (same shape): the norms,
    the moved share and, for a matrix, its effective rank and top-k energy share."""
    norm, base = frobenius(delta_any), frobenius(W_any)
    moved = moved_count(delta_any, tolerance)
    out = {"shape": list(W_any.shape), "norm": norm, "base_norm": base,
           "relative": norm / base if base > 0 else None,
           "moved": moved, "size": delta_any.numel(), "moved_share": moved / delta_any.numel()}
    if delta_any.dim() == 2:
        s_K = singular_values(delta_any)
        out.update(effective_rank=effective_rank(s_K), top_energy=top_energy(s_K, top_k),
                   max_rank=len(s_K))
    return out


def overall(tensors: dict[str, dict]) -> dict:
    """A model's whole update from its per-tensor stats (``tensor_stats``): the norms over
    every entry at once and the share of entries moved."""
    norm = float(np.sqrt(sum(t["norm"] ** 2 for t in tensors.values())))
    base = float(np.sqrt(sum(t["base_norm"] ** 2 for t in tensors.values())))
    moved = sum(t["moved"] for t in tensors.values())
    size = sum(t["size"] for t in tensors.values())
    return {"norm": norm, "base_norm": base, "relative": norm / base if base > 0 else None,
            "moved": moved, "size": size, "moved_share": moved / size}


# --- model folders, read tensor by tensor ------------------------------------------------------

def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of ``folder`` that holds it."""
    from safetensors import safe_open

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            out.update({name: path for name in f.keys()})
    return out


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every weight of ``folder``, from the file headers alone."""
    from safetensors import safe_open

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            out.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return out


def read_tensor(files: dict[str, Path], name: str) -> torch.Tensor:
    """One tensor, as stored, from a ``weight_files`` map."""
    from safetensors import safe_open

    with safe_open(files[name], framework="pt") as f:
        return f.get_tensor(name)


def architecture(folder: Path) -> tuple:
    """(model_type, architectures) from a model folder's config.json."""
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return cfg.get("model_type"), tuple(cfg.get("architectures") or ())


def check_same_weights(folders: dict[str, Path], what: str) -> None:
    """BadInput naming the first model of ``folders`` (label -> model folder) whose
    architecture or tensor shapes differ from the first model's; ``what`` opens it."""
    (first, path), *rest = folders.items()
    arch, shapes = architecture(path), weight_shapes(path)
    for label, other in rest:
        if architecture(other) != arch:
            raise BadInput(f"{what}: {label} is a {architecture(other)[0]} model "
                           f"({', '.join(architecture(other)[1]) or 'no architectures'}) and "
                           f"{first} a {arch[0]} ({', '.join(arch[1]) or 'no architectures'}); "
                           f"weights are only compared between models of one architecture.")
        theirs = weight_shapes(other)
        off = sorted(n for n in shapes.keys() | theirs.keys() if shapes.get(n) != theirs.get(n))
        if off:
            raise BadInput(f"{what}: {label} and {first} differ in {len(off)} tensor(s) (e.g. "
                           f"{off[0]}: {theirs.get(off[0])} against {shapes.get(off[0])}); "
                           f"weights are only compared between models of the same shapes, "
                           f"trained from one base.")


def reference_folder(inp: CheckInput, needs: str) -> Path:
    """The reference's model folder; BadInput unless ``--reference`` names one model."""
    cfg = inp.cfg
    found = [src for src in inp.sources if src.name == cfg.reference]
    if not found:
        raise BadInput(f"{needs} against the reference model, so --reference must name one "
                       f"model among --models (got {cfg.reference!r}, a method or no model; "
                       f"models: {', '.join(s.name for s in inp.sources)}).")
    return model_folder(inp, found[0], needs)


def _vocab(folder: Path) -> dict:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder).get_vocab()


def check_same_vocabulary(reference: str, ref: Path, trained: dict[str, Path], needs: str) -> None:
    """BadInput naming the first model of ``trained`` (name -> model folder) whose tokenizer
    has another vocabulary than the reference's (``ref``); ``needs`` opens it."""
    vocab = _vocab(ref)
    for name, folder in trained.items():
        if _vocab(folder) != vocab:
            raise BadInput(f"{needs}, but the reference {reference!r} is not the common base "
                           f"of the models: {name}'s tokenizer has another vocabulary "
                           f"({folder}); give the model they were all trained from as "
                           f"--reference.")


def check(inp: CheckInput) -> dict[str, Path]:
    """The model folders of the geometry, reference first: every model a folder (or samples
    recording one) of the reference's architecture, tensor shapes and tokenizer."""
    needs = "--geometry measures every model's weights"
    ref = reference_folder(inp, needs)
    trained = {src.name: model_folder(inp, src, needs) for src in inp.sources
               if src.name != inp.cfg.reference}
    if not trained:
        raise BadInput(f"{needs} against the reference, so it needs at least one model besides "
                       f"{inp.cfg.reference!r}; add one to --models.")
    check_same_weights(trained, "--geometry's models")
    folders = {inp.cfg.reference: ref, **trained}
    check_same_weights(folders, f"--geometry's reference {inp.cfg.reference!r} is not the "
                                f"common base of the models")
    check_same_vocabulary(inp.cfg.reference, ref, trained, needs)
    return folders


# --- the section -------------------------------------------------------------------------------

def update_geometry(folders: dict[str, Path], tolerance: float, top_k: int) -> dict:
    """Every model's update against the first folder of ``folders`` (name -> model folder):
    ``{"tensors": [names], "models": {name: {"overall", "tensors"}}, "cosines": [{"a", "b",
    "cosine"}]}``, tensor by tensor so that one tensor of each model is in memory at once."""
    (_, ref), *trained = folders.items()
    ref_files = weight_files(ref)
    files = {name: weight_files(folder) for name, folder in trained}
    names = list(files)
    per_model: dict[str, dict[str, dict]] = {name: {} for name in names}
    gram_C_C = np.zeros((len(names), len(names)))
    for tensor in ref_files:
        W = read_tensor(ref_files, tensor).float()
        deltas = [read_tensor(files[name], tensor).float() - W for name in names]
        for name, delta in zip(names, deltas):
            per_model[name][tensor] = tensor_stats(W, delta, tolerance, top_k)
        gram_C_C += gram(torch.stack([d.flatten() for d in deltas]))
    cos_C_C = cosines(gram_C_C)
    return {"tensors": list(ref_files),
            "models": {name: {"overall": overall(t), "tensors": t}
                       for name, t in per_model.items()},
            "cosines": [{"a": names[i], "b": names[j], "cosine": float(cos_C_C[i, j])}
                        for i, j in combinations(range(len(names)), 2)]}


@dataclass(frozen=True)
class Geometry:
    """comparison.json["geometry"]: the settings, the reference and ``update_geometry``'s
    result."""

    config: dict
    reference: str
    tensors: list[str]
    models: dict[str, dict]
    cosines: list[dict]

    def to_json(self) -> dict:
        return {"geometry": fields_dict(self)}


def compute(inp: SectionInput) -> Geometry:
    """``inp.checked``: the model folders, reference first (``check``)."""
    g = inp.cfg.geometry
    inp.echo(f"[compare] update geometry against {inp.cfg.reference}")
    return Geometry(to_dict(g), inp.cfg.reference,
                    **update_geometry(inp.checked, g.tolerance, g.top_k))


def figure(geo: dict, path: Path) -> str:
    """Heat map of log10 ‖ΔW‖ / ‖W‖ per tensor (rows) and model (columns)."""
    plt = pyplot()
    names, tensors = list(geo["models"]), geo["tensors"]
    rel_T_C = np.array([[geo["models"][m]["tensors"][t]["relative"] for m in names]
                        for t in tensors], dtype=float)  # None (a zero base tensor) -> NaN
    # A tall model (hundreds of tensors) gets thinner rows rather than an unreadable page.
    fig, ax = plt.subplots(figsize=(5 + 1.1 * len(names), min(1.5 + 0.22 * len(tensors), 40)))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_T_C = np.log10(rel_T_C)
    # An untouched tensor (log of 0) is left blank rather than stretching the colour scale.
    image = ax.imshow(np.ma.masked_invalid(log_T_C), aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=30)
    ax.set_yticks(range(len(tensors)), tensors, fontsize=6)
    fig.colorbar(image, ax=ax, label="log10 ‖ΔW‖ / ‖W‖")
    ax.set_title(f"relative update size against {geo['reference']}")
    return save_figure(fig, path)


def blocks(comp: dict, figures: dict[str, str]) -> list:
    """Update geometry: how far and in how many directions each model moved, and whether two
    models moved the same way."""
    geo = comp["geometry"]
    c = geo["config"]
    models = geo["models"]
    rows = []
    for name, m in models.items():
        o, matrices = m["overall"], [t for t in m["tensors"].values() if "effective_rank" in t]
        ranks = [t["effective_rank"] for t in matrices if t["effective_rank"] is not None]
        energy = [t["top_energy"] for t in matrices if t["top_energy"] is not None]
        rows.append([name, number(o["norm"]), number(o["relative"], 4), pct(o["moved_share"]),
                     number(float(np.median(ranks))) if ranks else "-",
                     pct(float(np.median(energy))) if energy else "-"])
    out: list = [Heading(2, "Update geometry"), Paragraph(
        f"What each model's training did to the weights of {geo['reference']}: Delta W is the "
        f"model's weights minus the reference's. Norms are Frobenius norms over every tensor; "
        f"moved: entries that changed by more than {c['tolerance']:g}; effective rank (exp of "
        f"the entropy of the normalised singular values, 1 for a rank-one update) and the "
        f"energy share of the top {c['top_k']} singular values are medians over the weight "
        f"matrices. Per-tensor numbers are in comparison.json[\"geometry\"]."),
        Table(["model", "‖ΔW‖", "‖ΔW‖ / ‖W‖", "moved", "effective rank (median)",
               f"top-{c['top_k']} energy (median)"], rows)]
    if geo["cosines"]:
        out.append(Paragraph("Cosine between two models' whole updates: near 0 means they "
                             "moved in orthogonal directions, 1 the same one; two seeds of "
                             "one method give the level noise alone reaches."))
        out.append(Table(["first", "second", "cosine"],
                         [[p["a"], p["b"], number(p["cosine"])] for p in geo["cosines"]]))
    out.append(Figure(figures["geometry"], "Relative update size ‖ΔW‖ / ‖W‖ per tensor and "
                      "model (log10 scale)."))
    return out


SECTIONS.register("geometry")(Section(
    place=130, enabled=lambda cfg: cfg.geometry.enabled, check=check, compute=compute,
    blocks=blocks,
    figures=lambda comp, folder: {"geometry": figure(comp["geometry"],
                                                     folder / "geometry.png")}))
