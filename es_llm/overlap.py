"""Evaluation problems a model was trained on: ``es-llm eval`` and ``es-llm compare`` warn
about them, and refuse them with ``--strict-overlap`` (``strict_overlap``).

A model folder ``RUN/checkpoints/NAME`` comes from the training run ``RUN``, whose
``config.yaml`` holds the task section it trained on; the run's training problems are built
again from that section (``build_task``, so ``task.select`` and ``task.limit`` apply as they
did in training). Two problems are the same when their prompts, as the task wrote them (before
any chat template) and with runs of whitespace made one space, are equal: ids differ between
files and generators, while a prompt states the whole problem.
"""

from __future__ import annotations

from pathlib import Path

from es_llm.config import from_dict, read_yaml
from es_llm.errors import BadInput
from es_llm.tasks import Problem, TaskConfig, build_task


def problem_key(problem: Problem) -> str:
    """What identifies ``problem`` across runs: its task prompt, whitespace collapsed."""
    return " ".join(problem.task_prompt.split())


def training_run(model: str | Path) -> Path | None:
    """The run folder the model folder ``model`` was saved in (``RUN/checkpoints/NAME``
    with a ``RUN/config.yaml``), or None."""
    folder = Path(model).resolve()
    run = folder.parent.parent
    if folder.parent.name == "checkpoints" and (run / "config.yaml").is_file():
        return run
    return None


def training_problems(run: Path) -> list[Problem]:
    """The problems the run ``run`` trained on, from its config.yaml's task section;
    BadInput when they cannot be built (a data file moved, a config without a task)."""
    section = read_yaml(run / "config.yaml").get("task")
    if not isinstance(section, dict):
        raise BadInput(f"{str(run / 'config.yaml')!r} has no task section.")
    task = build_task(from_dict(TaskConfig, section, prefix="task."))
    try:
        return task.problems()
    finally:
        task.close()


def shared_problems(evaluated: list[Problem], trained: list[Problem]) -> list[str]:
    """The ids of the ``evaluated`` problems that are also ``trained`` problems
    (``problem_key``), in order."""
    keys = {problem_key(p) for p in trained}
    return [p.id for p in evaluated if problem_key(p) in keys]


def check_overlap(problems: list[Problem], model: str | Path, strict: bool, echo) -> None:
    """Say (``echo``), once, how many of ``problems`` the model folder ``model`` was trained
    on; with ``strict``, raise BadInput instead. Nothing for a model that is not a training
    run's checkpoint."""
    run = training_run(model)
    if run is None:
        return
    try:
        shared = shared_problems(problems, training_problems(run))
    except BadInput as exc:
        message = (f"could not rebuild the training problems of the run {str(run)!r} that "
                   f"{str(model)!r} comes from, so its overlap with the evaluation problems "
                   f"is unchecked: {exc}")
        if strict:
            raise BadInput(f"{message} strict_overlap (--strict-overlap) needs the check; fix "
                           f"the run's config.yaml or turn it off.") from None
        echo(f"es-llm: note: {message}")
        return
    if not shared:
        return
    message = (f"{len(shared)} of the {len(problems)} evaluation problems (e.g. "
               f"{', '.join(shared[:3])}) are training problems of the run {str(run)!r} that "
               f"{str(model)!r} comes from (the same prompt), so scores on them measure "
               f"recall, not generalisation; evaluate on other rows (task.data, task.select)")
    if strict:
        raise BadInput(f"{message}, or leave strict_overlap (--strict-overlap) off to only warn.")
    echo(f"es-llm: warning: {message}, or set strict_overlap (--strict-overlap) to refuse this.")
