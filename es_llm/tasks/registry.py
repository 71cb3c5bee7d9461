"""The task registry, the one config every task is built from, and helpers tasks share.

Tasks register a builder with ``@register_task("name")``; ``build_task(TaskConfig(...))``
looks the name up once, at construction time, so callers never branch on task names.
The registry is the only module-level mutable state in ``es_llm.tasks``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Callable

from es_llm.config import SLICE, choice
from es_llm.errors import BadInput
from es_llm.tasks.base import MAX_COMPLETION_CHARS, Problem, Task
from es_llm.tasks.chat import ChatConfig
from populations.numbers import is_finite_number
from populations.registry import Registry

TASKS: Registry[Callable[["TaskConfig"], Task]] = Registry("task")
# Tasks whose answers sit in <answer> tags (so task.require_answer_tag means something).
_TAGGED: set[str] = set()

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class TaskConfig:
    """Which task to build and how; the same fields for every task.

    Procedural fields (``num_problems``, ``seed``, ``tiers``) are ignored when ``data`` names
    a file. ``select`` slices the rows first and ``limit`` then keeps the first N of them.
    ``format_weight`` mixes a format bonus into the reward:
    ``reward = format_weight * format_ok + (1 - format_weight) * correct``.
    """

    # Registered task name: countdown, arithmetic, math, humaneval, pyfunc, chess or knowledge.
    name: str = choice("countdown", lambda: task_names())
    # A local .jsonl / .json / .parquet file of problems; None = the task's generator.
    data: str | None = None
    # Rows to use, as a Python slice start:stop of the file's rows (or of the generated
    # list), negative counting from the end: 0:200, -2000: (the last 2000), 100: ; null =
    # all. Applied before task.limit. Quote it in a YAML file ("-2000:").
    select: str | None = None
    # Keep only the first N problems (of task.select's rows, or of all).
    limit: int | None = None
    # How many problems the generator makes (procedural only).
    num_problems: int = 200
    # Seed of the generator (procedural only).
    seed: int = 0
    # Difficulty tiers the generator cycles through; empty = the task's own default.
    tiers: tuple[int, ...] = ()
    # Wall-clock limit on verifying one completion, in seconds (math: a stuck verifier
    # process is killed shortly after).
    timeout_s: float = 5.0
    # Share of the reward given for a well-formed answer, in [0, 1).
    format_weight: float = 0.0
    # Tasks with <answer> tags (countdown, arithmetic, chess): count an answer only inside a
    # closed tag, as the ES paper's Countdown reward does; false also accepts the last line.
    require_answer_tag: bool = False
    # Tasks scored in-process (countdown, arithmetic, chess): a completion longer than this
    # many characters scores 0 before any parsing, so no output can make scoring slow. Such
    # completions are counted (too_long in eval's metrics.json, es/too_long and
    # rollout/too_long per training step) and the first is announced; a model that
    # legitimately reasons longer needs a higher bound.
    max_completion_chars: int = MAX_COMPLETION_CHARS
    # How prompts are sent to the model: raw, or through its chat template.
    chat: ChatConfig = field(default_factory=ChatConfig)
    # Code tasks: programs judged at once in the sandbox pool (0 = twice the CPU count).
    workers: int = 0
    # Code tasks: run model-written programs WITHOUT the bubblewrap sandbox (limits only).
    # Only for trusted code on machines where bubblewrap cannot run.
    unsafe_no_sandbox: bool = False

    def __post_init__(self):
        # YAML gives lists and callers may pass Paths; store the hashable, printable forms.
        if isinstance(self.tiers, list):
            object.__setattr__(self, "tiers", tuple(self.tiers))
        if isinstance(self.data, PurePath):
            object.__setattr__(self, "data", str(self.data))
        if self.name not in TASKS:
            raise BadInput(f"task.name {self.name!r} is not a registered task; choose one of "
                           f"{', '.join(task_names())}.")
        if self.data is not None:
            if not isinstance(self.data, str) or not self.data.strip():
                raise BadInput(f"task.data must be a file path or null (the task's generator), "
                               f"got {self.data!r}.")
            if not self.data.lower().endswith(DATA_SUFFIXES):
                raise BadInput(f"task.data {self.data!r} has an unsupported extension; use a "
                               f"{', '.join(DATA_SUFFIXES)} file, or null for the generator.")
        if self.select is not None:
            parse_select(self.select)
        if self.limit is not None and not (_is_int(self.limit) and self.limit >= 1):
            raise BadInput(f"task.limit must be a positive integer or null (keep all problems), "
                           f"got {self.limit!r}.")
        if not (_is_int(self.num_problems) and self.num_problems >= 1):
            raise BadInput(f"task.num_problems must be a positive integer, got "
                           f"{self.num_problems!r}.")
        if not _is_int(self.seed):
            raise BadInput(f"task.seed must be an integer, got {self.seed!r}.")
        if not isinstance(self.tiers, tuple) or not all(_is_int(t) and t >= 1 for t in self.tiers):
            raise BadInput(f"task.tiers must be a list of positive integers (empty = the task's "
                           f"default tiers), got {self.tiers!r}.")
        if not (is_finite_number(self.timeout_s) and 0 < self.timeout_s):
            raise BadInput(f"task.timeout_s must be a positive number of seconds, got "
                           f"{self.timeout_s!r}.")
        if not (_is_int(self.workers) and 0 <= self.workers <= 64):
            raise BadInput(f"task.workers must be an integer from 0 (twice the CPU count) to "
                           f"64, got {self.workers!r}.")
        if not isinstance(self.unsafe_no_sandbox, bool):
            raise BadInput(f"task.unsafe_no_sandbox must be true or false, got "
                           f"{self.unsafe_no_sandbox!r}.")
        if not (_is_int(self.max_completion_chars) and self.max_completion_chars >= 1):
            raise BadInput(f"task.max_completion_chars must be a positive integer (characters), "
                           f"got {self.max_completion_chars!r}.")
        if not (is_finite_number(self.format_weight) and 0 <= self.format_weight < 1):
            raise BadInput(f"task.format_weight must lie in [0, 1) (0 = reward correctness "
                           f"only), got {self.format_weight!r}.")
        if not isinstance(self.require_answer_tag, bool):
            raise BadInput(f"task.require_answer_tag must be true or false, got "
                           f"{self.require_answer_tag!r}.")
        if self.require_answer_tag and self.name not in _TAGGED:
            raise BadInput(f"task.require_answer_tag is for tasks whose answers sit in "
                           f"<answer> tags ({', '.join(sorted(_TAGGED))}); task {self.name!r} "
                           f"has none, so leave it false.")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def register_task(name: str, answer_tag: bool = False):
    """Decorator registering ``fn(cfg: TaskConfig) -> Task`` under ``name``; ``answer_tag``:
    the task reads its answers from ``<answer>`` tags and honours ``require_answer_tag``."""

    def decorator(fn: Callable[[TaskConfig], Task]):
        TASKS.register(name)(fn)
        if answer_tag:
            _TAGGED.add(name)
        return fn

    return decorator


def build_task(cfg: TaskConfig) -> Task:
    """Build the task ``cfg.name`` from ``cfg``; raises BadInput on unusable settings."""
    return TASKS.get(cfg.name)(cfg)


def task_names() -> list[str]:
    """The registered task names, sorted."""
    return TASKS.names()


def combine_reward(correct: bool, format_ok: bool, format_weight: float) -> float:
    """``format_weight * format_ok + (1 - format_weight) * correct``, a value in [0, 1]."""
    return format_weight * float(format_ok) + (1.0 - format_weight) * float(correct)


def check_tiers(task: str, tiers: tuple[int, ...], lowest: int, highest: int) -> None:
    """Raise BadInput unless every tier lies in ``[lowest, highest]``."""
    bad = [t for t in tiers if not lowest <= t <= highest]
    if bad:
        raise BadInput(f"task.tiers {list(tiers)} is invalid for {task}: tiers {bad} are out of "
                       f"range; each tier must be an integer from {lowest} to {highest}.")


def distinct_problems(
    generate: Callable[[random.Random, int], tuple[Problem, str]],
    key: Callable[[Problem], object],
    cfg: TaskConfig,
    tiers: tuple[int, ...],
) -> list[Problem]:
    """``cfg.num_problems`` distinct generated problems, cycling through ``tiers``.

    One ``random.Random(cfg.seed)`` stream drives everything, so the list is a pure function
    of the config and a longer list extends a shorter one. Duplicates (same ``key``) are
    redrawn, since a repeated problem would count twice in pass@k; a tier whose problem
    space is too small for the request raises BadInput instead of looping forever.
    """
    rng = random.Random(cfg.seed)
    seen: set = set()
    problems: list[Problem] = []
    for i in range(cfg.num_problems):
        tier = tiers[i % len(tiers)]
        # Generous: small tiers saturate slowly, and this bound only matters when exhausted.
        for _ in range(1000):
            problem, _ = generate(rng, tier)
            k = key(problem)
            if k not in seen:
                break
        else:
            raise BadInput(f"task {cfg.name!r} could not generate {cfg.num_problems} distinct "
                           f"problems: tier {tier} ran out after {len(problems)} problems in all; "
                           f"lower task.num_problems or add harder task.tiers.")
        seen.add(k)
        problems.append(Problem(id=f"{cfg.name}-s{cfg.seed}-{i:05d}", prompt=problem.prompt,
                                gold=problem.gold, difficulty=problem.difficulty,
                                meta=problem.meta))
    return problems


def parse_select(text) -> slice:
    """``task.select``'s ``start:stop`` (either may be empty or negative) as a slice;
    BadInput for anything else."""
    match = SLICE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise BadInput(f"task.select must be a slice start:stop of the data's rows, either "
                       f"end may be empty or negative (0:200, -2000:, 100:, :50), or null for "
                       f"all rows; got {text!r}.")
    start, stop = (None if g is None else int(g) for g in match.groups())
    return slice(start, stop)


def choose_rows(problems: list[Problem], cfg: TaskConfig) -> list[Problem]:
    """``cfg.select``'s slice of ``problems``, then its first ``cfg.limit``; BadInput when
    the slice keeps none of them."""
    if cfg.select is not None:
        chosen = problems[parse_select(cfg.select)]
        if not chosen:
            source = repr(cfg.data) if cfg.data is not None else f"the {cfg.name} generator"
            raise BadInput(f"task.select {cfg.select!r} keeps none of the {len(problems)} "
                           f"rows of {source}; choose a slice within 0:{len(problems)} "
                           f"(negative counts from the end, e.g. -{max(1, len(problems) // 2)}:).")
        problems = chosen
    return problems if cfg.limit is None else problems[:cfg.limit]


def read_limit(cfg: TaskConfig) -> int | None:
    """How many leading rows of the data file to read: ``cfg.limit`` alone needs no more,
    a selection may need any row (None: all)."""
    return cfg.limit if cfg.select is None else None


def data_path(cfg: TaskConfig) -> Path:
    """``cfg.data`` as a Path (callers check ``cfg.data is not None`` first)."""
    return Path(cfg.data).expanduser()


def file_or_generated(cfg: TaskConfig, load: Callable[[Path, int | None], list[Problem]],
                      generate: Callable[[random.Random, int], tuple[Problem, str]],
                      key: Callable[[Problem], object], tiers: tuple[int, ...]) -> list[Problem]:
    """A procedural task's problems: ``load(path, limit)`` of ``cfg.data`` when given, else
    ``distinct_problems`` of ``generate``; then ``cfg.select`` and ``cfg.limit``."""
    if cfg.data is not None:
        return choose_rows(load(data_path(cfg), read_limit(cfg)), cfg)
    return choose_rows(distinct_problems(generate, key, cfg, tiers), cfg)
