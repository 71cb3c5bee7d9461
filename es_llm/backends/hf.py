"""Generation with Hugging Face transformers: works everywhere, no extra engine.

The decoding loop is written out (KV cache, temperature, nucleus sampling) rather than
delegated to ``model.generate`` so that sampling is driven by an explicit
``torch.Generator`` and so each generated token's logprob is the quantity vLLM reports in
the same ``logprobs_mode`` (see ``sampled_logprobs``).

A prompt may also be input embeddings rather than tokens (a continuation from a soft prefix,
LatentRevise's): they replace the token embeddings in the prefill, and decoding goes on token
by token as usual; at embeddings that are the prompt's own tokens' the greedy ids are those of
the token prompt (tested on every stand-in architecture).

The KV cache is ``runtime.kv_cache``: ``dynamic`` (grows by one position a step),
``static`` (preallocated for the call, ``StaticDecoding``) or ``compiled`` (static, with the
decode step compiled by ``torch.compile``; CUDA graphs on a GPU). All three give the same
greedy ids (tested on the ci testbed).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch
from tqdm.auto import tqdm

from es_llm.backends.base import (Completion, SamplingParams, check_logprobs_mode,
                                  completion_text)
from es_llm.errors import NonFinite


NOT_FINITE = ("the model's next-token logits hold NaN or inf, so no token can be chosen from "
              "them; its weights have diverged or do not fit the dtype it runs in.")


def nucleus_sample(logits_B_V: torch.Tensor, temperature: float, top_p: float,
                   generator: torch.Generator) -> torch.Tensor:
    """Sample one token per row from ``softmax(logits / temperature)`` restricted to the
    smallest set of tokens whose probability reaches ``top_p`` (Holtzman et al. 2020).
    ``temperature == 0`` is greedy. Returns token ids of shape ``[B]``."""
    if temperature == 0:
        # argmax would pick a token even among NaNs and hide a broken model.
        if not bool(logits_B_V.isfinite().all()):
            raise NonFinite(NOT_FINITE, status=2)
        return logits_B_V.argmax(dim=-1)
    probs_B_V = torch.softmax(logits_B_V.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_B_V, order_B_V = probs_B_V.sort(dim=-1, descending=True)
        # Keep a token while the mass before it is still below top_p (the top token always).
        keep_B_V = (sorted_B_V.cumsum(dim=-1) - sorted_B_V) < top_p
        sorted_B_V = sorted_B_V * keep_B_V
        probs_B_V = torch.zeros_like(probs_B_V).scatter(-1, order_B_V, sorted_B_V)
    if probs_B_V.device != generator.device:
        # The draw happens where the generator lives, so a seed means the same tokens
        # whether the model runs on the CPU or an accelerator (given equal probabilities).
        probs_B_V = probs_B_V.to(generator.device)
    try:
        return torch.multinomial(probs_B_V, 1, generator=generator).squeeze(-1)
    except RuntimeError:
        # multinomial validates its input anyway; checking only when it refuses keeps the
        # per-token loop free of an extra pass over the vocabulary.
        if bool(probs_B_V.isfinite().all()):
            raise
        raise NonFinite(NOT_FINITE, status=2) from None


def sampled_logprobs(logits_B_V: torch.Tensor, next_B: torch.Tensor, params: SamplingParams,
                     mode: str) -> torch.Tensor:
    """Log-probability of each row's sampled token ``next_B`` (shape ``[B]``) given the raw
    next-token logits ``logits_B_V``; returns shape ``[B]`` in float32.

    ``mode == "raw"``: ``log_softmax(logits)``, before temperature and top-p.
    ``mode == "processed"``: the distribution the token was drawn from, as vLLM's
    ``processed_logprobs``: ``log_softmax(logits / temperature)``, and with ``top_p < 1``
    renormalised over the nucleus (``nucleus_sample``'s keep rule), i.e.
    ``log(p_t / sum of the kept p)``. Greedy (``temperature == 0``) applies no temperature,
    so both modes coincide there, as in vLLM.
    """
    logits_B_V = logits_B_V.float()
    if mode == "raw" or params.temperature == 0:
        return torch.log_softmax(logits_B_V, -1).gather(-1, next_B[:, None])[:, 0]
    logp_B_V = torch.log_softmax(logits_B_V / params.temperature, -1)
    lp_B = logp_B_V.gather(-1, next_B[:, None])[:, 0]
    if params.top_p < 1.0:
        sorted_B_V = logp_B_V.exp().sort(dim=-1, descending=True).values
        keep_B_V = (sorted_B_V.cumsum(dim=-1) - sorted_B_V) < params.top_p
        lp_B = lp_B - (sorted_B_V * keep_B_V).sum(-1).log()
    return lp_B


class DynamicDecoding:
    """The KV cache and the attention mask grow by one position a step: attention spans
    only what was generated so far, and every step has new shapes."""

    def __init__(self, model, mask_B_L: torch.Tensor):
        self.model, self.mask_B_L, self.cache = model, mask_B_L, None

    def prefill(self, inputs: dict, pos_B_L: torch.Tensor) -> torch.Tensor:
        """The prompts' forward pass (``inputs``: ``input_ids`` ``[B, L]`` or
        ``inputs_embeds`` ``[B, L, D]``); the next-token logits ``[B, V]``."""
        out = self.model(**inputs, attention_mask=self.mask_B_L, position_ids=pos_B_L,
                         use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def step(self, next_B: torch.Tensor, pos_B: torch.Tensor) -> torch.Tensor:
        """One token per row at positions ``pos_B``; the next-token logits ``[B, V]``."""
        ones_B_1 = torch.ones((len(next_B), 1), dtype=torch.long, device=next_B.device)
        self.mask_B_L = torch.cat([self.mask_B_L, ones_B_1], dim=1)
        out = self.model(input_ids=next_B[:, None], attention_mask=self.mask_B_L,
                         position_ids=pos_B[:, None], past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1]


class StaticDecoding(DynamicDecoding):
    """A KV cache and a mask preallocated for the whole call (prompt + max_tokens, rounded
    up to ``STATIC_LEN_STEP``), written in place: every step has the same shapes and the
    same tensors, which a compiled step (``step_fn``) needs to run without recompiling.
    Attention spans the whole preallocated length at every step (masked past the tokens
    generated so far), which costs more than the dynamic cache where the model is small."""

    def __init__(self, model, mask_B_L: torch.Tensor, cache, length: int, step_fn):
        B, L = mask_B_L.shape
        super().__init__(model, torch.zeros((B, length), dtype=torch.long,
                                            device=mask_B_L.device))
        self.mask_B_L[:, :L] = mask_B_L
        self.cache, self.step_fn, self.filled = cache, step_fn, L

    def prefill(self, inputs: dict, pos_B_L: torch.Tensor) -> torch.Tensor:
        out = self.model(**inputs, attention_mask=self.mask_B_L, position_ids=pos_B_L,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1]

    def step(self, next_B: torch.Tensor, pos_B: torch.Tensor) -> torch.Tensor:
        self.mask_B_L[:, self.filled] = 1
        self.filled += 1
        out = self.step_fn(input_ids=next_B[:, None], attention_mask=self.mask_B_L,
                           position_ids=pos_B[:, None], past_key_values=self.cache,
                           use_cache=True)
        # A CUDA-graph replay writes its outputs into the same buffers every step.
        return out.logits[:, -1].clone()


# Static cache lengths are rounded up to a multiple of this, so calls whose prompts differ
# a little in length share one cache and one compiled step.
STATIC_LEN_STEP = 16


class HFBackend:
    """Batched sampling from an ``AutoModelForCausalLM`` on the CPU (or a given device).

    ``logprobs_mode`` says which logprob ``SamplingParams.logprobs`` returns: ``"raw"``
    (unscaled log-softmax) or ``"processed"`` (after temperature and top-p); see
    ``sampled_logprobs``. ``kv_cache``: ``dynamic``, ``static`` or ``compiled`` (see the
    module docstring).
    """

    name = "hf"

    def __init__(self, model_path: str, batch_size: int = 512, device: str = "cpu",
                 load_kwargs: dict | None = None, model=None, tokenizer=None,
                 logprobs_mode: str = "raw", kv_cache: str = "dynamic"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.logprobs_mode = check_logprobs_mode(logprobs_mode)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
        # load_kwargs: from_pretrained's (dtype, attention; es_llm.runtime), default float32.
        self.model = model or AutoModelForCausalLM.from_pretrained(
            model_path, **(load_kwargs or {"dtype": torch.float32}))
        self.model.to(device).eval()
        self.device = device
        self.batch_size = batch_size
        self.kv_cache = kv_cache
        # The last static cache, reused by the next call of the same batch and length: a
        # compiled step is specialised to its tensors.
        self._static: tuple[tuple[int, int], object] | None = None
        self._compiled_step = None

    def generate(self, prompts: Sequence[str | Sequence[int] | torch.Tensor],
                 params: SamplingParams, progress: bool = False,
                 keys: Sequence[Hashable] | None = None) -> list[list[Completion]]:
        """``params.n`` completions per prompt, every row drawn from one generator seeded
        with ``params.seed`` (rows are independent draws, but a prompt's samples depend on
        the rest of the call; ``keys`` are not used). Beyond the ``Backend`` protocol, a
        prompt may be input embeddings ``[L, D]`` as the model's input embedding module
        returns them (the embeddings prefill; ``_prefill_inputs``)."""
        jobs = [(p, s) for p in range(len(prompts)) for s in range(params.n)]
        results: list[list[Completion | None]] = [[None] * params.n for _ in prompts]
        generator = torch.Generator(device="cpu").manual_seed(params.seed)
        bar = tqdm(total=len(jobs), desc="generate[hf]", unit="seq", disable=not progress)
        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start:start + self.batch_size]
            outs = self._generate_batch([prompts[p] for p, _ in chunk], params, generator)
            for (p, s), out in zip(chunk, outs):
                results[p][s] = out
            bar.update(len(chunk))
        bar.close()
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(self, prompts: list, params: SamplingParams,
                        generator: torch.Generator) -> list[Completion]:
        tok = self.tokenizer
        inputs, mask_B_L = self._prefill_inputs(prompts)
        B = len(mask_B_L)
        pos_B_L = (mask_B_L.cumsum(-1) - 1).clamp(min=0)

        decoding = self._decoding(mask_B_L, params.max_tokens)
        logits_B_V = decoding.prefill(inputs, pos_B_L)
        next_pos_B = pos_B_L[:, -1] + 1
        # Per-row state lives in tensors: at thousands of rows (an ES population in one call)
        # a Python loop over rows at every token would cost more than the model.
        tokens_B_T = torch.zeros((B, params.max_tokens), dtype=torch.long)
        lps_B_T = torch.zeros((B, params.max_tokens), dtype=torch.float32)
        length_B = torch.zeros(B, dtype=torch.long)
        done_B = torch.zeros(B, dtype=torch.bool)
        stopped_B = torch.zeros(B, dtype=torch.bool)
        for step in range(params.max_tokens):
            next_B = nucleus_sample(logits_B_V, params.temperature, params.top_p,
                                    generator).to(self.device)
            active_B = ~done_B
            # Like vLLM, the ids (and logprobs) end with the EOS that stopped the row, so a
            # trainer sees the decision to stop; the text leaves it out.
            tokens_B_T[:, step] = next_B.cpu()
            if params.logprobs:
                lps_B_T[:, step] = sampled_logprobs(logits_B_V, next_B, params,
                                                    self.logprobs_mode).cpu()
            length_B += active_B
            eos_B = active_B & (tokens_B_T[:, step] == tok.eos_token_id)
            stopped_B |= eos_B
            done_B |= eos_B
            if params.stop:
                for i in (active_B & ~eos_B).nonzero().flatten().tolist():
                    text = tok.decode(tokens_B_T[i, :length_B[i]].tolist(),
                                      skip_special_tokens=True)
                    if any(s in text for s in params.stop):
                        done_B[i] = stopped_B[i] = True
            if bool(done_B.all()):
                break
            logits_B_V = decoding.step(next_B, next_pos_B)
            next_pos_B = next_pos_B + 1
        lengths = length_B.tolist()
        return [self._finish(tokens_B_T[i, :n].tolist(),
                             lps_B_T[i, :n].tolist() if params.logprobs else None,
                             "stop" if stopped_B[i] else "length", params)
                for i, n in enumerate(lengths)]

    def _prefill_inputs(self, prompts: list) -> tuple[dict, torch.Tensor]:
        """The model's prefill inputs and the attention mask ``[B, L]``, left-padded so that
        every row's next token sits at the same position. A prompt is text (tokenized here),
        token ids (used as they are) or input embeddings ``[L, D]`` (``torch.Tensor``: a
        continuation from a soft prefix, which no token sequence spells); where any prompt of
        the batch is embeddings, the others enter as their tokens' embeddings, which the
        model turns into the same hidden states as their ids."""
        tok = self.tokenizer
        rows = [p if isinstance(p, torch.Tensor) else
                tok(p).input_ids if isinstance(p, str) else list(p) for p in prompts]
        B, L = len(rows), max(len(r) for r in rows)
        mask_B_L = torch.zeros((B, L), dtype=torch.long)
        for i, r in enumerate(rows):
            mask_B_L[i, L - len(r):] = 1
        mask_B_L = mask_B_L.to(self.device)
        if not any(isinstance(r, torch.Tensor) for r in rows):
            ids_B_L = torch.full((B, L), tok.pad_token_id, dtype=torch.long)
            for i, r in enumerate(rows):
                ids_B_L[i, L - len(r):] = torch.tensor(r)
            return {"input_ids": ids_B_L.to(self.device)}, mask_B_L
        embed = self.model.get_input_embeddings()
        # Padding positions are masked out, so their (zero) embeddings are never read.
        embeds_B_L_D = torch.zeros((B, L, embed.embedding_dim), dtype=embed.weight.dtype,
                                   device=self.device)
        for i, r in enumerate(rows):
            if not isinstance(r, torch.Tensor):
                r = embed(torch.tensor(r, device=self.device))
            embeds_B_L_D[i, L - len(r):] = r.to(self.device, embed.weight.dtype)
        return {"inputs_embeds": embeds_B_L_D}, mask_B_L

    def _decoding(self, mask_B_L: torch.Tensor, max_tokens: int) -> DynamicDecoding:
        """How this call decodes, by ``kv_cache``."""
        if self.kv_cache == "dynamic":
            return DynamicDecoding(self.model, mask_B_L)
        B, L = mask_B_L.shape
        key = (B, -(-(L + max_tokens) // STATIC_LEN_STEP) * STATIC_LEN_STEP)
        if self._static is None or self._static[0] != key:
            from transformers import StaticCache

            self._static = key, StaticCache(config=self.model.config, max_cache_len=key[1])
        cache = self._static[1]
        cache.reset()
        return StaticDecoding(self.model, mask_B_L, cache, key[1], self._step_fn())

    def _step_fn(self):
        """The decode step: the model itself, or (``compiled``) compiled once per backend,
        with CUDA graphs on a GPU (``reduce-overhead``) to drop the per-kernel launches."""
        if self.kv_cache != "compiled":
            return self.model
        if self._compiled_step is None:
            mode = "reduce-overhead" if str(self.device).startswith("cuda") else "default"
            self._compiled_step = torch.compile(self.model, mode=mode, dynamic=False)
        return self._compiled_step

    def _finish(self, token_ids: list[int], logprobs, finish: str,
                params: SamplingParams) -> Completion:
        # The text ends before the stop string; the ids keep the tokens that completed it.
        text = completion_text(self.tokenizer, token_ids, params.stop)
        return Completion(text=text, token_ids=tuple(token_ids),
                          logprobs=tuple(logprobs) if logprobs is not None else None,
                          finish_reason=finish)

    def close(self) -> None:
        self.model = self._static = self._compiled_step = None
