"""What every task provides: problems to prompt with, and a reward for a completion.

A task is a small object with a name, a way to produce ``Problem`` records (procedurally or
from a local file) and a ``score`` method. Trainers and evaluators only ever see this
interface, so ES, the gradient methods and the evaluator share one definition of reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

# The default of task.max_completion_chars: completions longer than this score 0 before any
# parsing. Scoring runs in-process inside ES and GRPO with no timeout, so no input may make
# it slow; 16k characters is some 4k tokens of reasoning.
MAX_COMPLETION_CHARS = 16_384


def answer_blocks(text: str, open_tag: str = "<answer>", close_tag: str = "</answer>"
                  ) -> list[str]:
    """The contents of the ``<answer>...</answer>`` blocks of ``text``, left to right.

    The same blocks as ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)`` (each
    block opens at the first opening tag after the previous block and closes at the first
    closing tag after that), found in time linear in ``len(text)``: the regex retries every
    opening tag that has no closing tag after it, which takes quadratic time on many
    unclosed openings.
    """
    blocks, pos = [], 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return blocks
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return blocks
        blocks.append(text[start + len(open_tag):end])
        pos = end + len(close_tag)


@dataclass(frozen=True)
class Problem:
    """One prompt with what is needed to check an answer.

    ``gold`` is task-specific plain data (JSON-serialisable): the target and numbers for
    Countdown, an integer for arithmetic, a LaTeX string for math. ``difficulty`` is a small
    integer tier (higher is harder) or 0 when the source has none. ``messages``: the chat
    a data row carries (``{"role", "content"}`` mappings), rendered in place of the prompt
    when the task's chat template is on. ``raw_prompt``: the prompt as the task wrote it,
    once ``prompt`` holds the chat-template rendering sent to the model (None before).
    """

    id: str
    prompt: str
    gold: Any
    difficulty: int = 0
    meta: dict = field(default_factory=dict)
    messages: tuple[dict, ...] | None = None
    raw_prompt: str | None = None

    @property
    def task_prompt(self) -> str:
        """The prompt as the task wrote it, before any chat template (what code tasks
        prepend to a completion, and what identifies a problem across runs)."""
        return self.prompt if self.raw_prompt is None else self.raw_prompt


@dataclass(frozen=True)
class Score:
    """The outcome of scoring one completion.

    ``reward`` lies in [0, 1]. ``correct`` is the verifier's verdict. ``answer`` is the parsed
    final answer as a string (None when nothing could be parsed). ``answer_key`` groups
    equivalent final answers (used by maj@k and answer entropy); ``solution_key`` groups
    equivalent solutions (used to count distinct correct solutions). ``error`` says why
    scoring failed, if it did; a failure always means reward 0, never an exception.
    ``too_long``: the completion exceeded the task's ``max_completion_chars`` and was not
    read at all.
    """

    reward: float
    correct: bool
    answer: str | None = None
    format_ok: bool = False
    answer_key: str | None = None
    solution_key: str | None = None
    error: str | None = None
    too_long: bool = False

    def details(self) -> dict:
        return {
            "answer": self.answer,
            "format_ok": self.format_ok,
            "answer_key": self.answer_key,
            "solution_key": self.solution_key,
            "error": self.error,
            "too_long": self.too_long,
        }


def too_long(completion: str, limit: int = MAX_COMPLETION_CHARS) -> Score | None:
    """A zero score for a completion longer than ``limit`` characters, else None; tasks
    check this before parsing anything."""
    if len(completion) <= limit:
        return None
    return Score(reward=0.0, correct=False, too_long=True,
                 error=f"completion too long ({len(completion)} chars > {limit})")


def too_long_notice(count: int, limit: int, where: str, key: str) -> str:
    """What a run says, once, when completions first exceed ``task.max_completion_chars``;
    ``key`` names the metric that counts them."""
    return (f"es-llm: {count} completion(s) {where} were longer than task.max_completion_chars="
            f"{limit} characters and scored 0 unread; if the model legitimately writes that "
            f"much, raise task.max_completion_chars ({key} in the metrics counts them; this is "
            f"said once).")


class Task(Protocol):
    """The interface every task implements."""

    name: str

    def problems(self) -> list[Problem]:
        """The problems of this task instance (from its generator or its data file)."""

    def score(self, problem: Problem, completion: str) -> Score:
        """Score one completion of ``problem``; never raises."""

    def score_many(self, pairs: Sequence[tuple[Problem, str]]) -> list[Score]:
        """Score many completions (may run in parallel); never raises."""

    def close(self) -> None:
        """Release worker processes, if any."""


class TaskBase:
    """Plumbing every task shares: a no-op ``close`` and use as a context manager."""

    def close(self) -> None:
        """Nothing to release unless a task overrides this."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InProcessTask(TaskBase):
    """A task whose scoring is cheap and bounded, so it runs in the caller's process.

    Subclasses implement ``_score``; ``score`` turns any exception into reward 0 with the
    error recorded, because a scorer bug must never stop a training run.
    """

    def _score(self, problem: Problem, completion: str) -> Score:
        raise NotImplementedError

    def score(self, problem: Problem, completion: str) -> Score:
        try:
            return self._score(problem, completion)
        except Exception as exc:  # noqa: BLE001
            return Score(reward=0.0, correct=False, error=f"internal error: {exc!r}"[:300])

    def score_many(self, pairs: Sequence[tuple[Problem, str]]) -> list[Score]:
        return [self.score(p, c) for p, c in pairs]
