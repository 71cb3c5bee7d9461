"""Configs as nested frozen dataclasses, loaded from YAML with ``key=value`` overrides.

Every experiment is a YAML file whose keys mirror a dataclass tree. Loading is strict:
an unknown key, a value of the wrong type (a float setting must also be finite) or a failed
``__post_init__`` check raises ``BadInput`` with a message that names the key and the valid
choices, so the CLI can exit with status 2 before anything is written. A section that is a
config of the model-free maths (``populations``, e.g. the ES run's ``es``) validates itself
with ``ValueError``; ``from_dict`` turns that into ``BadInput`` naming the key, once for all. YAML aliases
(``*name``) are refused: expanded before validation, a few lines of them can stand for
millions of nodes.

A run folder's ``config.yaml`` also carries a top-level ``machine`` section (the CPU, torch
build and accelerator it ran on, see ``es_llm.machine``): provenance, not a setting, so
loading a config file drops it.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from es_llm.errors import BadInput
from populations import settings
from populations.numbers import is_finite_number
# choice and field_choices are declared once, with the maths' configs; every config uses them
# from here.
from populations.settings import SettingError, choice, field_choices  # noqa: F401

C = TypeVar("C")

# The top-level key of a run's config.yaml that records the machine (not a setting).
MACHINE_KEY = "machine"
# A slice of rows, start:stop, either end empty or negative (task.select).
SLICE = re.compile(r"\s*(-?\d+)?\s*:\s*(-?\d+)?\s*")


class AliasRefused(yaml.YAMLError):
    """A YAML alias (``*name``) in a config: refused rather than expanded."""


class _NoAliasLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing aliases before it composes them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise AliasRefused(f"a YAML alias at line {mark.line + 1}, column {mark.column + 1}")
        return super().compose_node(parent, index)


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load`` without aliases (``AliasRefused``, a ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def check_choices(obj: Any, prefix: str = "") -> None:
    """``BadInput`` naming the field and its valid values when a ``choice`` field of the
    dataclass instance ``obj`` holds anything else; ``prefix`` is its dotted config path."""
    try:
        settings.check_choices(obj, prefix)
    except SettingError as exc:
        raise BadInput(f"{exc}.") from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert YAML forms (list->tuple)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except BadInput as exc:
                errors.append(str(exc))
        raise BadInput(f"config key '{key}' has value {value!r}, expected {_type_name(tp)}.")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise BadInput(f"config key '{key}' must be a mapping of the fields of "
                           f"{tp.__name__} ({', '.join(f.name for f in dataclasses.fields(tp))}), "
                           f"got {value!r}.")
        return from_dict(tp, value, prefix=key + ".")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise BadInput(f"config key '{key}' must be a list, got {value!r}.")
        item_tp = args[0] if args else Any
        return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise BadInput(f"config key '{key}' must be a mapping, got {value!r}.")
        if len(args) == 2:
            return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
        return dict(value)
    if tp is float:
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*", value):
            # YAML 1.1 reads 1e-3 (no dot) as a string; it is plainly meant as a number.
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInput(f"config key '{key}' must be a number, got {value!r}.")
        if not is_finite_number(value):
            raise BadInput(f"config key '{key}' must be a finite number, got {value!r}.")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(f"config key '{key}' must be an integer, got {value!r}.")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise BadInput(f"config key '{key}' must be true or false, got {value!r}.")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise BadInput(f"config key '{key}' must be a string, got {value!r}.")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for key {key}")


def from_dict(cls: type[C], data: dict, prefix: str = "") -> C:
    """Build dataclass ``cls`` from a (possibly partial) nested dict, strictly."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise BadInput(
            f"unknown config key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(prefix + k) for k in unknown)}; valid keys here are: "
            f"{', '.join(prefix + k for k in fields)}."
        )
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    section = prefix.rstrip(".")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise BadInput(f"config section '{section or cls.__name__}' is incomplete: {exc}.")
    except BadInput as exc:
        # A section used under several names (sampling, search, eval) validates its fields
        # without knowing its own: name the section unless the message already does.
        if section and f"{section}." not in str(exc) and f"'{section}" not in str(exc):
            raise BadInput(f"in config section '{section}': {exc}") from None
        raise
    except ValueError as exc:
        # The model-free maths (populations) validate their own configs with ValueError; this
        # is the one place it becomes the user's error, naming the key when the maths said
        # which field it was.
        if isinstance(exc, SettingError):
            raise BadInput(f"config key '{prefix}{exc.field}': {exc}.") from None
        raise BadInput(f"in config section '{section or cls.__name__}': {exc}.") from None


def to_dict(cfg: Any) -> dict:
    """The plain-data form of a config (tuples become lists), ready for YAML or JSON."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and a YAML-parsed value."""
    if "=" not in text:
        raise BadInput(f"override {text!r} is not of the form key=value (dotted keys for "
                       f"nested fields, e.g. sampling.temperature=0.7).")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise BadInput(f"override {text!r} has an empty key.")
    if SLICE.fullmatch(raw):
        # YAML reads -2000: as a mapping and 2:8 as a base-60 integer; such a value is a
        # slice of rows (task.select), kept as written.
        return key.split("."), raw.strip()
    try:
        value = load_yaml_text(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with dotted ``key=value`` overrides set (later wins)."""
    out = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise BadInput(f"override {text!r}: '{part}' is a value, not a section.")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(data: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping from ``path`` or raise ``BadInput`` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"config file {str(path)!r} does not exist (or is not a file).")
    try:
        data = load_yaml_text(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise BadInput(f"config file {str(path)!r} is not UTF-8 text (byte {exc.start} cannot "
                       f"be decoded); save it as UTF-8.") from None
    except OSError as exc:
        raise BadInput(f"config file {str(path)!r} could not be read: {exc.strerror}.") from None
    except AliasRefused as exc:
        raise BadInput(f"config file {str(path)!r} uses {exc}; es-llm configs do not expand "
                       f"aliases, so write the values out.") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"config file {str(path)!r} is not valid YAML: {exc}".replace("\n", " "))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"config file {str(path)!r} must hold a mapping at the top level, "
                       f"got {type(data).__name__}.")
    return data


def load_config(cls: type[C], base: dict | None = None, path: str | Path | None = None,
                overrides: list[str] | None = None, flags: dict | None = None) -> C:
    """Compose a config from layers into ``cls``, from weakest to strongest: the dataclass
    defaults, ``base`` (e.g. a preset), the YAML file at ``path``, ``flags`` (explicit
    command-line options) and the ``key=value`` overrides."""
    data = _deep_copy(base or {})
    if path is not None:
        data = _merge(data, {k: v for k, v in read_yaml(path).items() if k != MACHINE_KEY})
    data = _merge(data, flags or {})
    data = apply_overrides(data, overrides or [])
    return from_dict(cls, data)


def _merge(a: dict, b: dict) -> dict:
    out = _deep_copy(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def run_config_yaml(cfg: Any) -> str:
    """A run folder's config.yaml: the resolved config, then the ``machine`` it ran on."""
    from es_llm.machine import machine_info

    return yaml.safe_dump({**to_dict(cfg), MACHINE_KEY: machine_info()}, sort_keys=False)
