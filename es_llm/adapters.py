"""LoRA adapters (Hu et al. 2021, arXiv 2106.09685), shared by the gradient trainers and ES.

An adapter on a linear layer with weight ``W`` (out, in) is a pair ``A`` (r, in), ``B``
(out, r); the layer serves ``W + (alpha / r) B A``. Initialised as PEFT does (its default,
``init_lora_weights=True``): ``A`` kaiming-uniform with ``a = sqrt(5)`` (nn.Linear's own
init), ``B`` zero, so the adapted model starts equal to the base. Here the draw comes from
an explicit ``torch.Generator`` seeded by the run, so every MPI rank and every resume builds
the same adapter.

Tensors are named as PEFT names them inside a model (``<module>.lora_A.weight``), and an
adapter is saved in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``),
so ``peft.PeftModel.from_pretrained(base, folder)`` loads what es-llm writes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from es_llm.errors import BadInput

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    # Train (or evolve) a LoRA adapter instead of the model's own weights.
    enabled: bool = False
    # The adapter's rank r (>= 1) and alpha: a layer serves W + (alpha / r) B A.
    rank: int = 8
    alpha: float = 16.0
    # Dropout on the adapter's input while training (PEFT's lora_dropout); ES ignores it.
    dropout: float = 0.0
    # Modules that get an adapter, by the last part of their name (PEFT's target_modules),
    # or [all-linear] for every linear layer but the output head.
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise BadInput(f"lora.rank must be an integer >= 1, got {self.rank!r}.")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha)
                and self.alpha > 0):
            raise BadInput(f"lora.alpha must be a positive number, got {self.alpha!r}.")
        if not 0 <= self.dropout < 1:
            raise BadInput(f"lora.dropout must lie in [0, 1), got {self.dropout!r}.")
        if not self.target_modules or not all(isinstance(t, str) and t
                                              for t in self.target_modules):
            raise BadInput(f"lora.target_modules must be a non-empty list of module names "
                           f"(e.g. [q_proj, v_proj]) or [{ALL_LINEAR}], got "
                           f"{list(self.target_modules)!r}.")

    @property
    def scale(self) -> float:
        """PEFT's scaling of ``B A`` (without rsLoRA): alpha / r."""
        return self.alpha / self.rank


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def target_linears(model: torch.nn.Module, lora: LoraSettings) -> dict[str, torch.nn.Linear]:
    """The linear layers that get an adapter, by module name in the model's order.

    A name matches a target when its last dotted part equals it (PEFT's rule for a list of
    names); ``all-linear`` takes every ``nn.Linear`` except the output head (as PEFT does).
    BadInput names a target that matches no linear layer, with the names that would.
    """
    head = _output_head(model)
    linears = {n: m for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not head}
    if tuple(lora.target_modules) == (ALL_LINEAR,):
        chosen = linears
    else:
        chosen = {n: m for n, m in linears.items()
                  if n.rpartition(".")[2] in lora.target_modules}
        valid = sorted({n.rpartition(".")[2] for n in linears})
        missing = [t for t in lora.target_modules
                   if not any(n.rpartition(".")[2] == t for n in linears)]
        if missing:
            raise BadInput(f"lora.target_modules names {', '.join(missing)}, which this model "
                           f"({type(model).__name__}) has no linear layer called; valid names "
                           f"are: {', '.join(valid)} (or [{ALL_LINEAR}]).")
    if not chosen:
        raise BadInput(f"lora.target_modules={list(lora.target_modules)} selects no linear "
                       f"layer of {type(model).__name__}.")
    for name, m in chosen.items():
        if lora.rank > min(m.weight.shape):
            raise BadInput(f"lora.rank={lora.rank} is above the rank of {name} (shape "
                           f"{tuple(m.weight.shape)}); choose lora.rank between 1 and "
                           f"{min(m.weight.shape)}.")
    return chosen


def factor_names(module: str) -> tuple[str, str]:
    """The names of a module's ``A`` and ``B`` (as PEFT's tensors inside a model, without
    the adapter's name)."""
    return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


def init_factors(linears: Mapping[str, torch.nn.Linear], lora: LoraSettings,
                 seed: int) -> dict[str, torch.Tensor]:
    """Fresh float32 factors on CPU: per module ``A`` (r, in) kaiming-uniform(a=sqrt(5))
    from a generator seeded ``seed`` (modules in order), ``B`` (out, r) zero."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for module, layer in linears.items():
        a_name, b_name = factor_names(module)
        A_r_I = torch.empty(lora.rank, layer.in_features)
        torch.nn.init.kaiming_uniform_(A_r_I, a=math.sqrt(5), generator=g)
        out[a_name] = A_r_I
        out[b_name] = torch.zeros(layer.out_features, lora.rank)
    return out


def merged_weight(W_O_I: torch.Tensor, A_r_I: torch.Tensor, B_O_r: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """``W + scale * B A`` in float32 (the caller casts to the served dtype)."""
    return W_O_I.to(torch.float32) + scale * (B_O_r.to(torch.float32) @ A_r_I.to(torch.float32))


def merged_tensors(base: Mapping[str, torch.Tensor], factors: Mapping[str, torch.Tensor],
                   lora: LoraSettings) -> dict[str, torch.Tensor]:
    """``{<module>.weight: W + scale * B A}`` for every module of ``factors``, from the
    float32 base weights ``base`` (keyed ``<module>.weight``)."""
    out = {}
    for a_name in [n for n in factors if n.endswith(".lora_A.weight")]:
        module = a_name.removesuffix(".lora_A.weight")
        out[f"{module}.weight"] = merged_weight(base[f"{module}.weight"], factors[a_name],
                                                factors[factor_names(module)[1]], lora.scale)
    return out


def peft_config(lora: LoraSettings, modules: list[str] | None = None):
    """The ``peft.LoraConfig`` of these settings (``modules``: the exact module names, which
    pins the adapter to the layers ``target_linears`` chose)."""
    from peft import LoraConfig

    targets = modules if modules is not None else (
        ALL_LINEAR if tuple(lora.target_modules) == (ALL_LINEAR,) else list(lora.target_modules))
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")


def save_adapter(folder: Path, factors: Mapping[str, torch.Tensor], lora: LoraSettings,
                 base_model: str) -> None:
    """Write ``factors`` to ``folder`` in PEFT's format (``peft.PeftModel.from_pretrained``
    and vLLM's ``LoRARequest`` read it); the adapter records ``base_model`` as its base."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    modules = sorted({n.removesuffix(".lora_A.weight") for n in factors
                      if n.endswith(".lora_A.weight")})
    config = peft_config(lora, modules).to_dict()
    config["base_model_name_or_path"] = str(base_model)
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
    save_file({f"base_model.model.{n}": t.detach().to("cpu", torch.float32).contiguous()
               for n, t in factors.items()}, str(folder / "adapter_model.safetensors"))


def wrap_model(model: torch.nn.Module, lora: LoraSettings, seed: int):
    """``model`` as a ``peft.PeftModel`` with a fresh adapter on ``target_linears``, its
    factors those of ``init_factors(seed)`` (not PEFT's own draw from the global RNG), its
    base weights frozen. The train/eval mode stays the model's (PEFT's wrapper switches it)."""
    from peft import get_peft_model

    targets = target_linears(model, lora)
    factors = init_factors(targets, lora, seed)
    training = model.training
    wrapped = get_peft_model(model, peft_config(lora, list(targets)))
    load_peft_factors(wrapped, factors)
    return wrapped.train(training)


def _peft_name(name: str) -> str:
    """A PeftModel parameter's name without PEFT's prefix and adapter name:
    ``base_model.model.<module>.lora_A.default.weight`` -> ``<module>.lora_A.weight``,
    ``...<module>.base_layer.weight`` -> ``<module>.weight``."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".default.", ".").replace(".base_layer.", ".")


def peft_factors(model) -> dict[str, torch.Tensor]:
    """The adapter's factors of a PeftModel, named as ``init_factors`` names them (the
    model's own tensors, detached)."""
    return {_peft_name(n): p.detach() for n, p in model.named_parameters() if ".lora_" in n}


@torch.no_grad()
def load_peft_factors(model, factors: Mapping[str, torch.Tensor]) -> None:
    """Copy ``factors`` (``init_factors``' names) into a PeftModel's adapter; every factor
    must be given, with its shape."""
    own = {_peft_name(n): p for n, p in model.named_parameters() if ".lora_" in n}
    if own.keys() != factors.keys():
        missing = sorted(own.keys() ^ factors.keys())
        raise BadInput(f"the adapter does not fit the model: factors {missing[:3]} are in one "
                       f"but not the other (were lora.rank or lora.target_modules changed?).")
    for name, p in own.items():
        if p.shape != factors[name].shape:
            raise BadInput(f"the adapter's {name} has shape {tuple(factors[name].shape)}, the "
                           f"model's {tuple(p.shape)} (was lora.rank changed?).")
        p.copy_(factors[name])


def merged_parameters(model, lora: LoraSettings) -> dict[str, torch.Tensor]:
    """The HF-named parameters of a PeftModel's merged model (``model.named_parameters()``
    of the base, tied ones once), every adapted layer's weight ``W + scale B A`` in float32.
    What a checkpoint saves and a rollout engine is given."""
    params = {_peft_name(n): p.detach() for n, p in model.named_parameters()
              if ".lora_" not in n}
    return params | merged_tensors(params, peft_factors(model), lora)


def read_adapter(folder: Path) -> dict[str, torch.Tensor]:
    """The factors of an adapter ``save_adapter`` wrote to ``folder``, named as
    ``init_factors`` names them."""
    from safetensors.torch import load_file

    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        raise BadInput(f"{str(folder)!r} holds no LoRA adapter (adapter_model.safetensors); "
                       f"resume a run that trained with lora.enabled=true.")
    return {n.removeprefix("base_model.model."): t for n, t in load_file(str(path)).items()}
