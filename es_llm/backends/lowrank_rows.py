"""A low-rank ES population inside one batched forward pass of a Hugging Face model.

Rows of a batch belong to members: rows ``m k .. m k + k - 1`` are member m's ``k`` prompts.
While ``RowAdapters.members`` is active, every linear layer and embedding whose weight evolves
adds member m's rank-r term to its rows (EGGROLL, arXiv 2511.16652):

    linear:     y = x W^T + (x B_m) A_m^T
    embedding:  e = W[t] + A_m[t] B_m^T       (times the embedding's scale, if it has one)

with ``A_m`` already scaled by ``sign * sigma / sqrt(r)``, so row outputs equal those of a
model whose weights were set to ``W + sign * sigma * A B^T / sqrt(r)`` (up to rounding). No
weight is written; a tied output head (its weight is the embedding's Parameter) gets the
same member term as the embedding, as it would with written weights. The terms are two
``torch.bmm`` per layer over the ``(members, k * tokens, features)`` view of the activations.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from es_llm.errors import BadInput


@dataclass
class _Active:
    # Per tensor name: A (M, out, r) scaled per member, B (M, in, r); rows per member k.
    A: dict[str, torch.Tensor]
    B: dict[str, torch.Tensor]
    rows_per_member: int


class RowAdapters:
    """Forward hooks that add per-member low-rank terms to the evolving matrices of
    ``model`` (names as in ``named_parameters``). Raises BadInput if an evolving matrix is
    not the weight of an ``nn.Linear`` or ``nn.Embedding`` (this path cannot serve it)."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        first_name = {}
        for name, p in model.named_parameters():
            first_name.setdefault(id(p), name)
        params = dict(model.named_parameters())
        self.matrices = [n for n in names if params[n].ndim == 2]
        covered = set()
        self._handles = []
        for module in model.modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                continue
            name = first_name.get(id(module.weight))
            if name not in self.matrices:
                continue
            covered.add(name)
            if isinstance(module, torch.nn.Linear):
                hook = lambda mod, inputs, output, name=name: self._linear(  # noqa: E731
                    name, inputs[0], output)
            else:
                hook = lambda mod, inputs, output, name=name: self._embedding(  # noqa: E731
                    name, mod, inputs[0], output)
            self._handles.append(module.register_forward_hook(hook))
        missing = [n for n in self.matrices if n not in covered]
        if missing:
            self.close()
            raise BadInput(f"engine.serve=rows adds member terms to linear and embedding layers "
                           f"only; {', '.join(missing[:4])} is neither. Use engine.serve=weights "
                           f"(members' weights written one at a time) or engine.params=regex to "
                           f"evolve only linear layers.")
        self._active: _Active | None = None

    @contextlib.contextmanager
    def members(self, A: dict[str, torch.Tensor], B: dict[str, torch.Tensor],
                rows_per_member: int):
        """While open, batches of ``M * rows_per_member`` rows carry the M members whose
        factors are ``A[name]`` (M, out, r; scaled) and ``B[name]`` (M, in, r)."""
        self._active = _Active(A, B, rows_per_member)
        try:
            yield
        finally:
            self._active = None

    def _split(self, name: str, x: torch.Tensor):
        act = self._active
        A, B = act.A[name], act.B[name]
        M = A.shape[0]
        if x.shape[0] != M * act.rows_per_member:
            raise RuntimeError(f"a batch of {x.shape[0]} rows reached {name} while "
                               f"{M} members x {act.rows_per_member} rows are active")
        return A.to(x.dtype if x.is_floating_point() else A.dtype), B, M

    def _linear(self, name: str, x: torch.Tensor, y: torch.Tensor):
        if self._active is None:
            return None
        A, B, M = self._split(name, x)
        x_M_R_i = x.reshape(M, -1, x.shape[-1])
        delta = torch.bmm(torch.bmm(x_M_R_i, B.to(x.dtype)), A.transpose(1, 2))
        return y + delta.reshape(y.shape)

    def _embedding(self, name: str, module, ids: torch.Tensor, y: torch.Tensor):
        if self._active is None:
            return None
        A, B, M = self._split(name, ids)
        ids_M_R = ids.reshape(M, -1)
        rows = torch.gather(A, 1, ids_M_R[..., None].expand(-1, -1, A.shape[2]))
        delta = torch.bmm(rows.to(y.dtype), B.to(y.dtype).transpose(1, 2))
        # A scaled embedding (Gemma's: W[t] * sqrt(hidden), transformers' ``embed_scale``)
        # scales a written weight's rows too.
        scale = getattr(module, "embed_scale", None)
        if scale is not None:
            delta = delta * torch.as_tensor(scale, dtype=y.dtype, device=y.device)
        return y + delta.reshape(y.shape)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
