"""A backend without a model: it answers each problem with the problem's reference solution.

``es-llm eval --backend reference`` runs a task's whole scoring path on the solutions its
problems carry (HumanEval's canonical solutions, the generators' worked solutions), so a
verifier that rejects a correct answer shows up as pass@1 below 1.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from es_llm.backends.base import Completion, SamplingParams
from es_llm.errors import BadInput


class ReferenceBackend:
    name = "reference"

    def __init__(self, problems: Sequence, task_name: str):
        self._answers: dict[str, str] = {}
        for p in problems:
            # A whole worked completion when the problem has one, else its solution.
            answer = p.meta.get("reference") or p.meta.get("solution")
            if not isinstance(answer, str):
                raise BadInput(f"backend 'reference' answers with each problem's reference "
                               f"solution, but {task_name} problem {p.id!r} carries none; use "
                               f"a task or data file with solutions (a 'solution' or "
                               f"'reference' field), or a model backend (auto, hf, vllm).")
            self._answers[p.prompt] = answer

    def generate(self, prompts: Sequence[str], params: SamplingParams,
                 progress: bool = False, keys: Sequence[Hashable] | None = None
                 ) -> list[list[Completion]]:
        """Each prompt's own reference solution, ``params.n`` times (``keys`` unused)."""
        return [[Completion(text=self._answers[p], token_ids=(), logprobs=None,
                            finish_reason="stop")] * params.n for p in prompts]

    def close(self) -> None:
        """Nothing to release."""
