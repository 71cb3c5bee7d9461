"""Writing ES perturbations into a running vLLM engine.

The driver keeps the fp32 master in Hugging Face layout (one tensor per HF name) and sends
each member's cast weights through ``collective_rpc`` to ``ESWorkerExtension.es_write``,
which places them into vLLM's layout:

* fused parameters (``qkv_proj`` = q, k, v; ``gate_up_proj`` = gate, up; from the model's
  ``packed_modules_mapping``) are the HF shards concatenated along the output dimension, so
  the noise of a logical HF tensor is the same in both backends;
* a vocabulary-padded embedding gets the HF rows at its top;
* on the CPU, vLLM repacks linear weights for its GEMM kernels and drops the plain tensor,
  so a written layer is re-packed through its quant method's
  ``process_weights_after_loading``.

The engine runs in-process (see ``vllm_backend``), so the tensors are handed over by
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
    drop its prefix cache.

    The reset is required: the cache holds KV blocks computed under the old weights, and a
    later prompt sharing a cached prefix would reuse them instead of recomputing them under
    the new ones (TRL resets after every weight sync for the same reason).
    """
    llm.collective_rpc("es_write", args=({n: t.detach() for n, t in tensors.items()},))
    llm.reset_prefix_cache()


class ESWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``); reached by ``collective_rpc``."""

    def es_write(self, tensors: dict[str, torch.Tensor]) -> int:
        """Put HF-layout tensors into the model; returns how many vLLM tensors changed."""
        from vllm.platforms import current_platform

        model = self.model_runner.model
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        groups: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        counts: dict[str, int] = {}
        for hf_name, t in tensors.items():
            target, index, count = vllm_target(hf_name, packed)
            groups[target][index] = t
            counts[target] = count
        modules = dict(model.named_modules())
        repack = current_platform.is_cpu()
        for target, shards in groups.items():
            if len(shards) != counts[target]:
                raise ValueError(f"{target} is fused from {counts[target]} tensors but "
                                 f"{len(shards)} were given; evolve all parts or none")
            full = torch.cat([shards[i] for i in range(counts[target])], dim=0)
            module_name, _, leaf = target.rpartition(".")
            layer = modules[module_name]
            in_place = _write(layer, leaf, full, repack)
            if repack and in_place and full.ndim == 2:
                _repack_tied(modules, layer, leaf)
        return len(groups)


@torch.no_grad()
def _write(layer: torch.nn.Module, leaf: str, full: torch.Tensor, repack: bool) -> bool:
    """Put ``full`` into ``layer.<leaf>``; True when it was written into the existing tensor
    (which other layers may share), False when the layer got a tensor of its own."""
    param = getattr(layer, leaf)
    method = getattr(layer, "quant_method", None)
    in_place = param.numel() > 0
    if not in_place:
        # The CPU backend dropped the plain weight after packing it; give it back, re-pack.
        # ``full`` is es_write's own concatenation, so it is handed over without a copy.
        setattr(layer, leaf, torch.nn.Parameter(full.to(param.dtype), requires_grad=False))
    elif param.shape == full.shape:
        param.copy_(full)
    elif param.ndim == full.ndim and param.shape[1:] == full.shape[1:] \
            and param.shape[0] >= full.shape[0]:
        param[: full.shape[0]].copy_(full)  # vocabulary padded to a multiple of 64
    else:
        raise ValueError(f"cannot place a {tuple(full.shape)} tensor into {leaf} of shape "
                         f"{tuple(param.shape)}")
    if repack and method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(layer)
    return in_place


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

    @property
    def params(self):
        return self.hf.params

    @property
    def master(self):
        return self.hf.master

    def _send(self, tensors: dict[str, torch.Tensor]) -> None:
        push_hf_tensors(self.llm, tensors)

    @torch.no_grad()
    def perturb(self, noise_for, sign: int, sigma: float) -> None:
        """Send the member's tensors (``hf_weights.member``) to the engine. The HF copy keeps
        the master throughout (it serves checkpoints), which saves writing every tensor into
        it and reading it back for each member."""
        self._send(dict(self.hf.member(noise_for, sign, sigma)))

    @torch.no_grad()
    def restore(self) -> None:
        self._send(dict(self.hf.served_master()))

    def set_master(self, new_master) -> None:
        self.hf.set_master(new_master)
        self.restore()

    def shapes(self):
        return self.hf.shapes()

    def checksum(self) -> str:
        return self.hf.checksum()
