"""The generation interface shared by ES, the gradient methods and evaluation.

One ``SamplingParams``, one ``Completion``, one ``Backend.generate``; the Hugging Face and
vLLM implementations take the same parameters and return the same fields.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Protocol, Sequence

from es_llm.errors import BadInput


LOGPROBS_MODES = ("raw", "processed")


def check_logprobs_mode(mode: str) -> str:
    """``mode`` if it names a logprobs mode; ``BadInput`` otherwise."""
    if mode not in LOGPROBS_MODES:
        raise BadInput(f"unknown logprobs_mode {mode!r}; valid choices are: "
                       f"{', '.join(LOGPROBS_MODES)} (raw = log-softmax of the unscaled logits, "
                       "processed = after temperature and top-p).")
    return mode


@dataclass(frozen=True)
class SamplingParams:
    """How to sample.

    ``temperature == 0`` means greedy decoding. ``seed`` makes sampling reproducible: the
    same prompts, params and seed give the same completions on the same backend. With vLLM,
    every prompt of a call draws from a stream of its own (``stream_seeds``), so a problem's
    samples depend only on the seed and its key, not on what else is in the call; the HF loop
    draws all rows of a call from one generator seeded with ``seed``.
    ``logprobs`` asks for the log-probability of each generated token. Which distribution it
    is taken under is a setting of the backend, not of the request (``logprobs_mode`` of
    ``HFBackend`` and ``VLLMBackend``): ``"raw"`` (the default) is the log-softmax of the
    unscaled logits, before temperature and top-p, as vLLM reports by default; ``"processed"``
    is the distribution the token was drawn from, after temperature and top-p, which is what
    an importance ratio against the trainer needs.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int = 0
    logprobs: bool = False

    def __post_init__(self):
        if self.n < 1:
            raise BadInput(f"n (samples per prompt) must be at least 1, got {self.n}.")
        if self.temperature < 0:
            raise BadInput(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"top_p must lie in (0, 1], got {self.top_p}.")
        if self.max_tokens < 1:
            raise BadInput(f"max_tokens must be at least 1, got {self.max_tokens}.")


@dataclass(frozen=True)
class Completion:
    """One generated continuation: its text (stop string and EOS excluded), token ids (with
    the EOS that ended it, if one did), and per-token logprobs aligned with the ids when they
    were asked for. ``finish_reason`` is "stop" (EOS or a stop string) or "length".
    ``trace`` is what a diffusion sampler saw (``DiffusionTrace``), None for the others."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str
    trace: object = None


def completion_text(tokenizer, token_ids: Sequence[int], stop: Sequence[str] = ()) -> str:
    """The text of a completion from its token ids: the project's one convention, which both
    the HF loop and vLLM follow, so the same ids give the same text on either backend.

    The ids are decoded whole with ``skip_special_tokens=True`` (the EOS that ended a
    completion is not text). A completion cut inside a multi-byte UTF-8 character (at
    ``max_tokens``, with a byte-level tokenizer) ends in bytes that are no character; they
    decode to U+FFFD, and trailing U+FFFD characters are dropped, as vLLM's incremental
    detokenizer holds them back (a completion that really ends in U+FFFD loses it too). The
    text then ends before the first stop string in it, if any.
    """
    text = tokenizer.decode(list(token_ids), skip_special_tokens=True).rstrip("\ufffd")
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def stream_seeds(seed: int, count: int, keys: Sequence[Hashable] | None = None) -> list[int]:
    """One sampling seed per prompt of a call: a hash of the call's ``seed``, the prompt's
    key (``keys[i]``, e.g. the problem id; its position when no keys are given) and how many
    earlier prompts of the call had the same key.

    So duplicated prompts draw different samples, a problem keeps its samples when other
    problems join the call, and a rerun with the same seed is identical. Without this every
    request of a call shared one seed, and sample i of every prompt came from the same random
    stream: samples of different problems were correlated, which the bootstrap over problems
    and GRPO's batch statistics assume they are not. Seeds are below 2**62, leaving room for
    an engine that derives its n samples' streams as seed + i (vLLM's parallel sampling).
    """
    keys = list(range(count)) if keys is None else list(keys)
    if len(keys) != count:
        raise ValueError(f"{len(keys)} stream keys for {count} prompts")
    seen: Counter = Counter()
    seeds = []
    for key in keys:
        text = f"{seed}\x1f{key!r}\x1f{seen[key]}"
        seen[key] += 1
        digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
        seeds.append(int.from_bytes(digest, "little") >> 2)
    return seeds


class Backend(Protocol):
    """Generates ``n`` completions for each prompt; returns them as ``[prompt][sample]``.
    A prompt is a string or a list of token ids (fed to the model exactly as given).
    ``keys`` name the prompts' random streams (problem ids; see ``stream_seeds``); a backend
    that draws every row from one generator ignores them."""

    name: str

    def generate(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams,
                 progress: bool = False, keys: Sequence[Hashable] | None = None
                 ) -> list[list[Completion]]:
        ...

    def close(self) -> None:
        ...
