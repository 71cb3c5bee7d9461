"""A low-rank ES population inside one batched forward pass of a Hugging Face model.

Rows of a batch belong to members: rows ``m k .. m k + k - 1`` are member m's ``k`` prompts.
While ``RowAdapters.members`` is active, every linear layer and embedding whose weight evolves
adds member m's rank-r term to its rows (EGGROLL, arXiv 2511.16652):

    linear:     y = x W^T + (x B_m) A_m^T
    embedding:  e = W[t] + A_m[t] B_m^T       (times the embedding's scale, if it has one)

with ``A_m`` already scaled by ``sign * sigma / sqrt(r)``, so row outputs equal those of a
model whose weights were set to ``W + sign * sigma * A B^T / sqrt(r)`` (up to rounding). No
weight is written; a tied output head (its weight is the embedding's Parameter) gets the
same member term as the embedding, as it would with written weights.

The terms cost what generation costs only if they add few operations per layer: on a small
model every operation's fixed cost, not its arithmetic, sets the step time. So layers that
read the same input (q/k/v, gate/up; found once by a probe forward) share one product with
their concatenated B factors, each layer then adds ``(x B_m) A_m^T`` into its own output in
place (one ``baddbmm_``), and the layers' ``forward`` is replaced while members are active
(module hooks take the slow call path of ``nn.Module``). Which layers share is only a saving:
a layer reuses the shared product only when its input is the very tensor the product was
computed from.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from es_llm.errors import BadInput


@dataclass
class _Active:
    # Per tensor name: A^T (M, r, out) scaled per member, contiguous (a transposed view
    # halves bmm's speed at these sizes); per input group: the group's B
    # factors side by side (M, in, sum of r), and the input and product last computed.
    A_T: dict[str, torch.Tensor]
    B_group: list[torch.Tensor]
    A_emb: dict[str, torch.Tensor]
    B_emb_T: dict[str, torch.Tensor]
    rows_per_member: int
    members: int
    last_x: list
    last_xB: list


class RowAdapters:
    """Per-member low-rank terms added to the evolving matrices of ``model`` (names as in
    ``named_parameters``). Raises BadInput if an evolving matrix is not the weight of an
    ``nn.Linear`` or ``nn.Embedding`` (this path cannot serve it)."""

    def __init__(self, model: torch.nn.Module, names: list[str]):
        first_name = {}
        for name, p in model.named_parameters():
            first_name.setdefault(id(p), name)
        params = dict(model.named_parameters())
        self.matrices = [n for n in names if params[n].ndim == 2]
        # (module, tensor name) of every layer that adds a member term.
        self._linears: list[tuple[torch.nn.Linear, str]] = []
        self._embeddings: list[tuple[torch.nn.Embedding, str]] = []
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                name = first_name.get(id(module.weight))
                if name in self.matrices:
                    kind = self._linears if isinstance(module, torch.nn.Linear) else self._embeddings
                    kind.append((module, name))
        covered = {n for _, n in self._linears + self._embeddings}
        missing = [n for n in self.matrices if n not in covered]
        if missing:
            raise BadInput(f"engine.serve=rows adds member terms to linear and embedding layers "
                           f"only; {', '.join(missing[:4])} is neither. Use engine.serve=weights "
                           f"(members' weights written one at a time) or engine.params=regex to "
                           f"evolve only linear layers.")
        self._groups = _shared_input_groups(model, self._linears)
        self._active: _Active | None = None

    @contextlib.contextmanager
    def members(self, A: dict[str, torch.Tensor], B: dict[str, torch.Tensor],
                rows_per_member: int):
        """While open, batches of ``M * rows_per_member`` rows carry the M members whose
        factors are ``A[name]`` (M, out, r; scaled) and ``B[name]`` (M, in, r), in the
        dtype of the weight they perturb."""
        groups = [torch.cat([B[n] for _, n in group], dim=2) for group in self._groups]
        M = next(iter(A.values())).shape[0]
        self._active = _Active(
            A_T={n: A[n].transpose(1, 2).contiguous() for n in self.matrices},
            B_group=groups, A_emb={n: A[n] for _, n in self._embeddings},
            B_emb_T={n: B[n].transpose(1, 2).contiguous() for _, n in self._embeddings},
            rows_per_member=rows_per_member, members=M,
            last_x=[None] * len(groups), last_xB=[None] * len(groups))
        # A forward already set on the instance (accelerate's offloading hooks set one) is
        # what the member term wraps, and it is put back afterwards.
        own = {id(m): m.__dict__.get("forward") for m, _ in self._linears + self._embeddings}
        try:
            for g, group in enumerate(self._groups):
                at = 0
                for module, name in group:
                    width = A[name].shape[2]
                    module.forward = self._linear_forward(module, name, g, at, at + width)
                    at += width
            for module, name in self._embeddings:
                module.forward = self._embedding_forward(module, name)
            yield
        finally:
            for module, _ in self._linears + self._embeddings:
                if own[id(module)] is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.forward = own[id(module)]
            self._active = None

    def _rows(self, x: torch.Tensor, what: str) -> int:
        act = self._active
        if x.shape[0] != act.members * act.rows_per_member:
            raise RuntimeError(f"a batch of {x.shape[0]} rows reached {what} while "
                               f"{act.members} members x {act.rows_per_member} rows are active")
        return act.members

    def _linear_forward(self, module: torch.nn.Linear, name: str, g: int, lo: int, hi: int):
        act, original = self._active, module.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            y = original(x)
            if act.last_x[g] is not x:
                M = self._rows(x, name)
                act.last_xB[g] = torch.bmm(x.reshape(M, -1, x.shape[-1]), act.B_group[g])
                act.last_x[g] = x
            xB = act.last_xB[g]
            y.view(xB.shape[0], xB.shape[1], -1).baddbmm_(xB[..., lo:hi], act.A_T[name])
            return y
        return forward

    def _embedding_forward(self, module: torch.nn.Embedding, name: str):
        act, original = self._active, module.forward
        # A scaled embedding (Gemma's: W[t] * sqrt(hidden), transformers' ``embed_scale``)
        # scales a written weight's rows too.
        scale = getattr(module, "embed_scale", None)
        alpha = 1.0 if scale is None else float(scale)

        def forward(ids: torch.Tensor) -> torch.Tensor:
            y = original(ids)
            M = self._rows(ids, name)
            A = act.A_emb[name]
            ids_M_R = ids.reshape(M, -1)
            rows = torch.gather(A, 1, ids_M_R[..., None].expand(-1, -1, A.shape[2]))
            y.view(M, ids_M_R.shape[1], -1).baddbmm_(rows, act.B_emb_T[name], alpha=alpha)
            return y
        return forward


def _shared_input_groups(model: torch.nn.Module, linears: list[tuple[torch.nn.Linear, str]]
                         ) -> list[list[tuple[torch.nn.Linear, str]]]:
    """The linear layers grouped by the input they read, in call order, found by one
    forward pass of two tokens (q/k/v read one tensor, gate/up another). Layers the probe
    does not reach form groups of their own."""
    seen: list[tuple[torch.Tensor, tuple]] = []
    handles = [entry[0].register_forward_pre_hook(
        lambda mod, inputs, entry=entry: seen.append((inputs[0], entry)))
        for entry in linears]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device))
    finally:
        for h in handles:
            h.remove()
    groups: list[list] = []
    placed: set[int] = set()
    last = None
    for x, entry in seen:
        if id(entry[0]) in placed:
            continue  # a layer called twice
        if x is last:
            groups[-1].append(entry)
        else:
            groups.append([entry])
        last = x
        placed.add(id(entry[0]))
    groups += [[entry] for entry in linears if id(entry[0]) not in placed]
    return groups
