"""The one registry type of the project: named variants that take one shared typed input
(tasks, fitness shapings, optimizers, perturbation kinds, evotorch algorithms, diffusion
commit rules, advantage estimators, policy losses, aggregation modes, KL and log-prob
estimators, importance-sampling modes, distillation methods, trainer stages, test-time
methods). It lives in the bottom layer so that every package can use it.

An unknown name fails naming the valid ones; registering a different entry under a taken
name fails (re-running the same definition is harmless).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

F = TypeVar("F")


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding ``entry`` under ``name``; ValueError if a different entry has it."""

        def decorator(entry: F) -> F:
            if name in self._entries and self._entries[name] != entry:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return decorator

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> F:
        """The entry under ``name``; ValueError naming the valid choices if there is none."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of "
                             f"{', '.join(self.names())}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    @contextmanager
    def registered(self, name: str, entry: F):
        """``entry`` under ``name`` for the duration of a ``with`` block (tests, scripts)."""
        self.register(name)(entry)
        try:
            yield entry
        finally:
            self._entries.pop(name, None)
