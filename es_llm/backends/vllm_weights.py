"""Writing ES perturbations into a running vLLM engine.

The driver keeps the fp32 master in Hugging Face layout (one tensor per HF name) and
computes each member's cast weights straight into the engine's tensors, which
``ESWorkerExtension.es_views`` hands out through ``collective_rpc`` in vLLM's layout:

* fused parameters (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up; from the model's
  ``packed_modules_mapping``) are the HF shards concatenated along the output dimension, so
  the noise of a logical HF tensor is the same in both backends;
* a vocabulary-padded embedding gets the HF rows at its top;
* on the CPU, vLLM repacks linear weights for its GEMM kernels and drops the plain tensor,
  so a written layer is re-packed through its quant method's
  ``process_weights_after_loading``.

The engine runs in-process (see ``vllm_backend``), so the views are handed over by
reference, not serialised. Prefix caching is off in the ES engine: a cached prompt prefix
computed under one member's weights must not serve another member.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def vllm_target(hf_name: str, packed: dict[str, list[str]]) -> tuple[str, int, int]:
    """``(vllm parameter name, shard index, number of shards)`` for an HF parameter name."""
    module, _, leaf = hf_name.rpartition(".")
    parent, _, last = module.rpartition(".")
    for fused, parts in packed.items():
        if last in parts:
            return f"{parent}.{fused}.{leaf}", parts.index(last), len(parts)
    return hf_name, 0, 1


def push_hf_tensors(llm, tensors: dict[str, torch.Tensor]) -> None:
    """Write HF-named tensors into the engine ``llm`` (built with ``ESWorkerExtension``) and
    drop its prefix cache (see ``write_hf_tensors``)."""
    llm.collective_rpc("es_write", args=({n: t.detach() for n, t in tensors.items()},))
    llm.reset_prefix_cache()


def write_hf_tensors(llm, shapes: dict[str, torch.Size], fill) -> None:
    """Let ``fill(views)`` write the HF-named tensors of ``shapes`` straight into the engine
    ``llm`` (``views[name]``: where that tensor lives in vLLM's layout, ``es_views``), then
    re-pack what needs it and drop the prefix cache.

    The reset is required: the cache holds KV blocks computed under the old weights, and a
    later prompt sharing a cached prefix would reuse them instead of recomputing them under
    the new ones (TRL resets after every weight sync for the same reason).
    """
    views = llm.collective_rpc("es_views", args=(dict(shapes),))[0]
    with torch.no_grad():
        fill(views)
    llm.collective_rpc("es_commit", args=(list(shapes),))
    llm.reset_prefix_cache()


class ESWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``); reached by ``collective_rpc``.

    A write is two calls: ``es_views`` hands out where each HF tensor goes, the caller fills
    those views, ``es_commit`` puts them into service. On the CPU, vLLM drops the plain
    weight of a linear layer after packing it; such a layer's views are rows of a buffer of
    the worker's own, kept from one write to the next and handed to the layer at commit.
    Filled in place, a member costs no copy besides its computation: at Qwen2.5-0.5B's size
    (fp32, CPU) a member computed into fresh memory took 1.2 s and concatenating its fused
    tensors into fresh memory another 0.9 s, mostly first touches of new pages. The buffers
    are the worker's, not the caller's, because a layer that keeps its tensor is written in
    place the next time, which must never reach the caller's master."""

    def es_write(self, tensors: dict[str, torch.Tensor]) -> int:
        """Copy HF-layout tensors into the model in one call; returns how many vLLM tensors
        changed."""
        views = self.es_views({n: t.shape for n, t in tensors.items()})
        with torch.no_grad():
            for name, t in tensors.items():
                views[name].copy_(t)
        return self.es_commit(list(tensors))

    def es_views(self, shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
        """``{hf name: view}``: rows of the vLLM parameter where the layer keeps a plain
        weight (a vocabulary may be padded below), else rows of the layer's buffer."""
        views = {}
        for target, shards in self._es_targets(shapes).items():
            layer, leaf = self._es_layer(target)
            param = getattr(layer, leaf)
            rest = shards[0][1][1:]
            rows = sum(shape[0] for _, shape in shards)
            if param.numel() > 0:
                if param.shape[1:] != rest or param.shape[0] < rows:
                    raise ValueError(f"cannot place a {(rows, *rest)} tensor into {target} of "
                                     f"shape {tuple(param.shape)}")
                dest = param.data
            else:
                buffers = self.__dict__.setdefault("_es_buffers", {})
                dest = buffers.get(target)
                if dest is None or dest.shape != (rows, *rest) or dest.dtype != param.dtype:
                    dest = buffers[target] = torch.empty((rows, *rest), dtype=param.dtype,
                                                         device=param.device)
            at = 0
            for name, shape in shards:
                views[name] = dest[at:at + shape[0]]
                at += shape[0]
        return views

    def es_commit(self, names: list[str]) -> int:
        """Serve what the views of ``names`` hold; returns how many vLLM tensors changed."""
        from vllm.platforms import current_platform

        repack = current_platform.is_cpu()
        modules = dict(self.model_runner.model.named_modules())
        targets = self._es_targets({n: (0,) for n in names})
        for target in targets:
            layer, leaf = self._es_layer(target)
            in_place = getattr(layer, leaf).numel() > 0
            if not in_place:
                setattr(layer, leaf, torch.nn.Parameter(self._es_buffers[target],
                                                        requires_grad=False))
            method = getattr(layer, "quant_method", None)
            if repack and method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(layer)
            if repack and in_place and getattr(layer, leaf).ndim == 2:
                _repack_tied(modules, layer, leaf)
        return len(targets)

    def _es_targets(self, shapes: dict[str, tuple]) -> dict[str, list[tuple[str, tuple]]]:
        """``{vLLM parameter: [(hf name, shape) in shard order]}``; every part of a fused
        parameter must be there."""
        model = self.model_runner.model
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        groups: dict[str, dict[int, tuple]] = defaultdict(dict)
        counts: dict[str, int] = {}
        for hf_name, shape in shapes.items():
            target, index, count = vllm_target(hf_name, packed)
            groups[target][index] = (hf_name, tuple(shape))
            counts[target] = count
        for target, shards in groups.items():
            if len(shards) != counts[target]:
                raise ValueError(f"{target} is fused from {counts[target]} tensors but "
                                 f"{len(shards)} were given; evolve all parts or none")
        return {t: [shards[i] for i in range(counts[t])] for t, shards in groups.items()}

    def _es_layer(self, target: str) -> tuple[torch.nn.Module, str]:
        module_name, _, leaf = target.rpartition(".")
        return self.model_runner.model.get_submodule(module_name), leaf


def _repack_tied(modules: dict, layer: torch.nn.Module, leaf: str) -> None:
    """Re-pack every other layer that shares the written tensor (a tied LM head packs the
    embedding matrix for its own GEMM). Only a matrix written in place can be shared (a
    layer whose packed weight was dropped gets a tensor no other layer holds): scanning every
    module after every write took a quarter of a write at the 0.5B shape."""
    ptr = getattr(layer, leaf).data_ptr()
    for other in modules.values():
        w = getattr(other, "weight", None)
        if other is layer or not isinstance(w, torch.Tensor) or w.numel() == 0:
            continue
        method = getattr(other, "quant_method", None)
        if w.data_ptr() == ptr and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(other)


class VLLMWeights:
    """ES weights served by a vLLM engine; the HF-layout master lives in ``hf_weights``
    (a ``ModuleWeights`` over the driver's HF copy, which also serves checkpoints)."""

    def __init__(self, llm, hf_weights):
        self.llm = llm
        self.hf = hf_weights
        self._served = {n: p.shape for n, p in hf_weights.params.items()}

    @property
    def params(self):
        return self.hf.params

    @property
    def master(self):
        return self.hf.master

    def perturb(self, noise_for, sign: int, sigma: float) -> None:
        """Compute the member's tensors (``hf_weights.member``) straight into the engine's
        (``write_hf_tensors``). The HF copy keeps the master throughout (it serves
        checkpoints), which saves writing every tensor into it and reading it back for each
        member."""
        write_hf_tensors(self.llm, self._served,
                         lambda views: list(self.hf.member(noise_for, sign, sigma, out=views)))

    def restore(self) -> None:
        write_hf_tensors(self.llm, self._served, lambda views: [
            views[n].copy_(t) for n, t in self.hf.served_master()])

    def set_master(self, new_master) -> None:
        self.hf.set_master(new_master)
        self.restore()

    def shapes(self):
        return self.hf.shapes()

    def checksum(self) -> str:
        return self.hf.checksum()
