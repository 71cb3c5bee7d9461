"""The generation interface shared by ES, the gradient methods and evaluation.

One ``SamplingParams``, one ``Completion``, one ``Backend.generate``; the Hugging Face and
vLLM implementations take the same parameters and return the same fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from es_llm.errors import BadInput


@dataclass(frozen=True)
class SamplingParams:
    """How to sample.

    ``temperature == 0`` means greedy decoding. ``seed`` makes sampling reproducible: the
    same prompts, params and seed give the same completions on the same backend.
    ``logprobs`` asks for the log-probability of each generated token under the model's
    unscaled distribution (log-softmax of the raw logits, before temperature and top-p; the
    same quantity vLLM reports by default).
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
            raise BadInput(f"sampling n (samples per prompt) must be at least 1, got {self.n}.")
        if self.temperature < 0:
            raise BadInput(f"sampling temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise BadInput(f"sampling top_p must lie in (0, 1], got {self.top_p}.")
        if self.max_tokens < 1:
            raise BadInput(f"sampling max_tokens must be at least 1, got {self.max_tokens}.")


@dataclass(frozen=True)
class Completion:
    """One generated continuation: its text (stop string and EOS excluded), token ids (with
    the EOS that ended it, if one did), and per-token logprobs aligned with the ids when they
    were asked for. ``finish_reason`` is "stop" (EOS or a stop string) or "length"."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str


class Backend(Protocol):
    """Generates ``n`` completions for each prompt; returns them as ``[prompt][sample]``."""

    name: str

    def generate(self, prompts: Sequence[str], params: SamplingParams,
                 progress: bool = False) -> list[list[Completion]]:
        ...

    def close(self) -> None:
        ...
