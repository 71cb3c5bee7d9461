"""How a config of the population maths says what is wrong with it.

The maths raise ``ValueError`` (this package knows nothing of command lines), as a
``SettingError`` that names the offending field, so a loader that read the config from a
file can name the key the user wrote (``es_llm.config.from_dict`` does, once for every
section). A ``choice`` field's valid values come from a registry, read when checked, which
is also what ``--help-config`` lists.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

# The field metadata key under which a choice field keeps its registry's names.
CHOICES = "choices"


class SettingError(ValueError):
    """A config field holding a value the maths cannot use; ``field`` is its name."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def choice(default: str, names: Callable[[], Iterable[str]]):
    """A string field whose value must be one of ``names()`` (a registry's names, read when
    checked): validated by ``check_choices``, listed by ``--help-config``."""
    return dataclasses.field(default=default, metadata={CHOICES: names})


def field_choices(f: dataclasses.Field) -> list[str] | None:
    """The valid values of a ``choice`` field, None for any other field."""
    names = f.metadata.get(CHOICES)
    return None if names is None else list(names())


def check_choices(obj: Any, prefix: str = "") -> None:
    """``SettingError`` naming the field and its valid values when a ``choice`` field of the
    dataclass instance ``obj`` holds anything else; ``prefix`` is its dotted config path."""
    for f in dataclasses.fields(obj):
        valid = field_choices(f)
        value = getattr(obj, f.name)
        if valid is not None and value not in valid:
            raise SettingError(f.name, f"unknown {prefix}{f.name} {value!r}; valid choices "
                                       f"are: {', '.join(valid)}")
