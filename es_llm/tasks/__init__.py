"""Tasks: problems to prompt with and verifiable rewards (Countdown, arithmetic, math).

``build_task(TaskConfig(name=..., data=...))`` is the one entry point; importing this package
registers the three task modules.
"""

from es_llm.tasks.base import Problem, Score, Task
from es_llm.tasks.registry import TaskConfig, build_task, register_task, task_names

# Imported for their @register_task side effect (after the registry exists).
from es_llm.tasks import arithmetic, chess, code, countdown, knowledge, math, pyfunc  # noqa: E402,F401,E501  isort: skip

__all__ = ["Problem", "Score", "Task", "TaskConfig", "build_task", "register_task",
           "task_names", "arithmetic", "countdown", "math"]
