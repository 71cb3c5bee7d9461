"""Which weights evolve, and how a member's perturbation is put into a torch module.

The fp32 master copy is the truth: a member's weights are ``cast(master + sigma * eps)``
(``populations.es.perturb``, one tensor at a time) and restoring re-casts the master, so
perturb-then-restore leaves the served weights bitwise unchanged (adding and then
subtracting the same noise does not, in any precision).
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable

import torch

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

    @torch.no_grad()
    def perturb(self, noise_for: Callable[[str, torch.Size], torch.Tensor], sign: int,
                sigma: float) -> None:
        """Set each tensor to the member ``cast(master + sign * sigma * noise_for(name,
        shape))``, computed by ``populations.es.perturb``."""
        for name, p in self.params.items():
            p.copy_(perturb(self.master[name], noise_for(name, p.shape), sign, sigma,
                            dtype=p.dtype))

    @torch.no_grad()
    def restore(self) -> None:
        for name, p in self.params.items():
            p.copy_(self.master[name].to(p.dtype))

    @torch.no_grad()
    def set_master(self, new_master) -> None:
        """Adopt new fp32 master tensors (not copied: callers hand over immutable state)."""
        self.master = {n: new_master[n] for n in self.params}
        self.restore()

    def checksum(self) -> str:
        """A digest of the master copy, compared across ranks to catch divergence."""
        h = hashlib.sha256()
        for name in sorted(self.master):
            h.update(name.encode())
            h.update(self.master[name].detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]
