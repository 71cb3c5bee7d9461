"""One small registry type for the gradient subsystem's variants (advantage estimators,
policy losses, aggregation modes, KL estimators): every entry of a registry takes the same
typed input, and an unknown name fails naming the valid ones."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding ``fn`` under ``name``; a different function under a taken name
        raises ValueError (re-running the same definition is harmless)."""

        def decorator(fn: F) -> F:
            if name in self._fns and self._fns[name] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._fns[name] = fn
            return fn

        return decorator

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._fns)

    def get(self, name: str) -> F:
        """The function under ``name``; ValueError naming the valid choices if there is none."""
        if name not in self._fns:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of "
                             f"{', '.join(self.names())}")
        return self._fns[name]
