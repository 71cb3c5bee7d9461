"""``--help-config``: every config key of a command, from its config dataclasses.

For each key: its dotted name, type, default, the comment written above the field in the
source (the one place each setting is described), and, for a ``choice`` field, the names its
registry accepts.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
import typing
from functools import lru_cache
from typing import Any

from es_llm.config import field_choices

_FIELD_RE = re.compile(r"^(\s+)(\w+)\s*:")


@lru_cache(maxsize=None)
def field_comments(cls: type) -> dict[str, str]:
    """The comment block above each field of dataclass ``cls``, joined into one line, from
    the class that declares the field (a settings class may extend a maths config). A
    field written right below another, with no comment of its own, shares that one's (one
    comment may describe a group, such as ``# Prompts per step (P) and rollouts per prompt
    (G).`` above two fields)."""
    inherited: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            inherited.update(field_comments(base))
    return {**inherited, **_own_comments(cls)}


def _own_comments(cls: type) -> dict[str, str]:
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    pending: list[str] = []
    last = ""
    for line in lines[1:]:
        stripped = line.strip()
        match = _FIELD_RE.match(line)
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
        elif match and match.group(2) in names:
            last = comments[match.group(2)] = " ".join(pending) if pending else last
            pending = []
        elif not line.startswith(" " * 8):
            # A blank line, a method or anything else ends a group.
            last, pending = "", []
    return {k: v for k, v in comments.items() if v}


def key_field(cls: type, key: str) -> tuple[dataclasses.Field, str]:
    """The field that dotted ``key`` names in the config tree rooted at ``cls``, and its
    comment. A key that is not there is a ValueError: it is a mistake in the code that asks
    (a command's flag table), not in the user's input."""
    *sections, name = key.split(".")
    for section in sections:
        cls = typing.get_type_hints(cls).get(section)
        if not dataclasses.is_dataclass(cls):
            raise ValueError(f"{key!r} names no config key: {section!r} is not a section.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ValueError(f"{key!r} names no config key: {cls.__name__} has no field {name!r}.")
    return fields[name], field_comments(cls).get(name, "")


def config_keys(cls: type, default: Any = None, prefix: str = "") -> list[dict]:
    """One entry per leaf key of the config tree rooted at ``cls``: ``key``, ``type``,
    ``default`` (taken from the default instance, so nested sections show the defaults of
    their parent), ``help`` and ``choices`` (None unless a registry decides)."""
    default = cls() if default is None else default
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value, tp = getattr(default, f.name), hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += config_keys(tp, value, f"{prefix}{f.name}.")
            continue
        out.append({"key": prefix + f.name, "type": _type_text(tp), "default": value,
                    "help": comments.get(f.name, ""), "choices": field_choices(f)})
    return out


def _type_text(tp: Any) -> str:
    text = getattr(tp, "__name__", None) if not typing.get_args(tp) else None
    return text or str(tp).replace("typing.", "").replace("NoneType", "None")


def _value_text(value: Any) -> str:
    """A default as it would be written in YAML (null, true, [1, 2], 'text')."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        value = list(value)
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def format_config_help(cls: type, command: str, note: str = "") -> str:
    """The text ``es-llm COMMAND --help-config`` prints."""
    head = (f"Config keys of `es-llm {command}`: set them in the --config YAML file (nested "
            f"sections) or as key=value overrides (dotted keys, e.g. a.b=1). Precedence: "
            f"defaults < --config file < flags < overrides. `--print-config` shows the "
            f"resolved values without running anything.")
    lines = textwrap.wrap(head, 92) + ([""] + textwrap.wrap(note, 92) if note else []) + [""]
    for k in config_keys(cls):
        lines.append(f"{k['key']}  ({k['type']}, default {_value_text(k['default'])})")
        text = k["help"] or "(no description)"
        if k["choices"] is not None:
            text += f" Choices: {', '.join(map(str, k['choices']))}."
        lines += textwrap.wrap(text, 88, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)
