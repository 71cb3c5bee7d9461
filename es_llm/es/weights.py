"""Which weights evolve, and how a member's perturbation is put into a torch module.

The fp32 master copy is the truth: a member's weights are ``cast(master + sigma * eps)``
(``populations.es.perturb``, one tensor at a time) and restoring re-casts the master, so
perturb-then-restore leaves the served weights bitwise unchanged (adding and then
subtracting the same noise does not, in any precision). ``AdapterWeights`` does the same for
a LoRA adapter's factors, served merged into the target layers' weights.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable, Iterable, Iterator

import torch

from es_llm.adapters import LoraSettings, factor_names, merged_tensors
from es_llm.errors import BadInput
from populations.es import perturb

PARAMETER_FILTERS = ("all", "matrices", "regex")


def select_parameters(model: torch.nn.Module, which: str, pattern: str = "") -> list[str]:
    """Names of the parameters that evolve, in the module's order.

    ``all``: every parameter; ``matrices``: those with two or more dimensions (weights, not
    norms or biases); ``regex``: names matching ``pattern`` (``re.search``). Tied tensors
    appear once, under their first name.
    """
    if which not in PARAMETER_FILTERS:
        raise BadInput(f"unknown parameter filter {which!r}; valid filters are: "
                       f"{', '.join(PARAMETER_FILTERS)}.")
    names = [n for n, _ in model.named_parameters()]  # named_parameters() skips tied repeats
    params = dict(model.named_parameters())
    if which == "matrices":
        names = [n for n in names if params[n].ndim >= 2]
    elif which == "regex":
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise BadInput(f"parameter pattern {pattern!r} is not a valid regular expression: {exc}.")
        names = [n for n in names if rx.search(n)]
    if not names:
        raise BadInput(f"the parameter filter {which!r} (pattern {pattern!r}) selects no "
                       f"parameters; some names are: {', '.join(list(params)[:6])}.")
    return names


class ModuleWeights:
    """The evolving tensors of a torch module, with their fp32 master copy."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        params = dict(model.named_parameters())
        self.params = {n: params[n] for n in names}
        self.master = {n: p.detach().to(torch.float32).clone() for n, p in self.params.items()}

    def shapes(self) -> dict[str, torch.Size]:
        return {n: t.shape for n, t in self.master.items()}

    def member(self, noise_for: Callable[[str, torch.Size], torch.Tensor], sign: int,
               sigma: float, out: dict[str, torch.Tensor] | None = None
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the member ``cast(master + sign * sigma * noise_for(name,
        shape))`` (``populations.es.perturb``), one tensor at a time, each written into
        ``out[name]`` when ``out`` is given (the same bits), else into fresh memory."""
        for name, p in self.params.items():
            yield name, perturb(self.master[name], noise_for(name, p.shape), sign, sigma,
                                dtype=p.dtype, out=None if out is None else out[name])

    def served_master(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the master cast to the served dtype (the tensor itself when
        that is fp32)."""
        for name, p in self.params.items():
            yield name, self.master[name].to(p.dtype)

    @torch.no_grad()
    def perturb(self, noise_for: Callable[[str, torch.Size], torch.Tensor], sign: int,
                sigma: float) -> None:
        """Set each tensor to the member (see ``member``), computed into the served tensor."""
        for _ in self.member(noise_for, sign, sigma, out=self.params):
            pass

    def restore(self) -> None:
        _copy_into(self.params, self.served_master())

    @torch.no_grad()
    def set_master(self, new_master) -> None:
        """Adopt new fp32 master tensors (not copied: callers hand over immutable state)."""
        self.master = {n: new_master[n] for n in self.params}
        self.restore()

    def checksum(self) -> str:
        """A digest of the master copy, compared across ranks to catch divergence."""
        return master_checksum(self.master)


@torch.no_grad()
def _copy_into(params: dict[str, torch.Tensor], tensors: Iterable[tuple[str, torch.Tensor]]
               ) -> None:
    for name, t in tensors:
        params[name].copy_(t)


def master_checksum(master: dict[str, torch.Tensor]) -> str:
    """A short SHA-256 of named tensors' bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(master):
        h.update(name.encode())
        h.update(master[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class AdapterWeights:
    """A LoRA adapter's factors as the evolving set (``lora.enabled``), served merged.

    ``master`` holds the fp32 factors keyed as PEFT names them (``<module>.lora_A.weight``
    (r, in), ``<module>.lora_B.weight`` (out, r)): what ``populations.es`` evolves, with
    full-rank i.i.d. noise on each factor, and what checksums cover. ``params`` are the
    target layers' served weights keyed ``<module>.weight`` (so ``VLLMWeights`` pushes them
    by their HF names). A member with factors ``A' = A + s sigma eps_A``, ``B' = B + s sigma
    eps_B`` is served as ``cast(W0 + scale B' A')`` (fp32 base ``W0``, scale = alpha / r):
    its weight change has rank <= r, and while B = 0 (the start) its first-order effect comes
    through eps_B only. This differs from ``es.kind=lowrank`` (EGGROLL), which adds low-rank
    noise to the full matrices themselves; here the parameter set is the small adapter.
    """

    def __init__(self, linears: dict[str, torch.nn.Linear], factors: dict[str, torch.Tensor],
                 lora: LoraSettings):
        self.modules = list(linears)
        self.lora = lora
        self.params = {f"{m}.weight": layer.weight for m, layer in linears.items()}
        self.base = {n: p.detach().to(torch.float32).clone() for n, p in self.params.items()}
        device = next(iter(self.params.values())).device
        self.master = {n: t.to(device, torch.float32) for n, t in factors.items()}

    def shapes(self) -> dict[str, torch.Size]:
        return {n: t.shape for n, t in self.master.items()}

    def member_factors(self, noise_for: Callable[[str, torch.Size], torch.Tensor], sign: int,
                       sigma: float) -> dict[str, torch.Tensor]:
        """The member's fp32 factors ``master + sign * sigma * noise_for(name, shape)``
        (``populations.es.perturb``, kept in fp32: they are merged before any cast)."""
        return {n: perturb(t, noise_for(n, t.shape), sign, sigma) for n, t in self.master.items()}

    def _merged(self, factors: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        # One module at a time: an fp32 merged copy of every target at once could not fit
        # beside a large model.
        for module in self.modules:
            pair = {n: factors[n] for n in factor_names(module)}
            for name, W_O_I in merged_tensors(self.base, pair, self.lora).items():
                yield name, W_O_I.to(self.params[name].dtype)

    def member(self, noise_for: Callable[[str, torch.Size], torch.Tensor], sign: int,
               sigma: float, out: dict[str, torch.Tensor] | None = None
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the member's target weights ``cast(W0 + scale B' A')``, one
        at a time, each copied into ``out[name]`` when ``out`` is given."""
        for name, W in self._merged(self.member_factors(noise_for, sign, sigma)):
            yield name, W if out is None else out[name].copy_(W)

    def served_master(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the master adapter merged: ``cast(W0 + scale B A)``, the
        same bytes every time (computed afresh from fp32, never by undoing a member)."""
        return self._merged(self.master)

    @torch.no_grad()
    def perturb(self, noise_for: Callable[[str, torch.Size], torch.Tensor], sign: int,
                sigma: float) -> None:
        """Serve the member (see ``member``)."""
        for _ in self.member(noise_for, sign, sigma, out=self.params):
            pass

    def restore(self) -> None:
        """Serve the master adapter merged (see ``served_master``)."""
        _copy_into(self.params, self.served_master())

    @torch.no_grad()
    def serve_base(self) -> None:
        """Serve ``cast(W0)`` in the target layers (per-row adapter terms are added on top;
        ``restore`` puts the merged master back)."""
        for name, p in self.params.items():
            p.copy_(self.base[name].to(p.dtype))

    def row_terms(self, members: list[dict[str, torch.Tensor]]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``RowAdapters`` terms of M members' factors (each as ``member_factors`` gives):
        per target weight ``A`` (M, out, r) = scale B'_m and ``B`` (M, in, r) = A'_m^T, so a
        row of member m computes ``x W0^T + x A'_m^T (scale B'_m)^T``, in the served dtype."""
        A, B = {}, {}
        for module in self.modules:
            name = f"{module}.weight"
            a_name, b_name = factor_names(module)
            dtype = self.params[name].dtype
            A[name] = torch.stack([self.lora.scale * f[b_name] for f in members]).to(dtype)
            B[name] = torch.stack([f[a_name].T for f in members]).to(dtype)
        return A, B

    def set_master(self, new_master) -> None:
        """Adopt new fp32 factors (not copied: callers hand over immutable state)."""
        self.master = {n: new_master[n] for n in self.master}
        self.restore()

    def checksum(self) -> str:
        """A digest of the master factors, compared across ranks to catch divergence."""
        return master_checksum(self.master)
