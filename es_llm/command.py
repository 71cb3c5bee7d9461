"""What an ``es-llm`` subcommand is made of, and the parts every subcommand shares.

A subcommand is one ``Command`` object, registered by the name users type under the
``es_llm.commands`` entry point group (setup.cfg): the core's commands and gradient's alike,
so ``es_llm.cli`` discovers all of them and imports none. A command declares its flags as a
table of ``Flag`` rows, each naming the config key it sets; a flag's help is that field's
comment (``es_llm.config_help``), so a setting's meaning and default are written once, in
its dataclass, and ``flag_values`` is the one bridge from flags to the config.

The line is parsed by argparse rather than jsonargparse (4.53, tried on these dataclasses):
jsonargparse takes overrides as ``--sampling.top_p 0.9`` and refuses the bare
``sampling.top_p=0.9`` words the command line promises, shows a field's type and default
but not the comment above it, and checks types only, where ``es_llm.config.from_dict`` also
checks registered choices, finite floats and cross-field rules in one ``BadInput``.
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from es_llm.errors import BadInput

OVERRIDES_HELP = ("config overrides as key=value with dotted keys for nested fields, e.g. "
                  "sampling.top_p=0.95 task.limit=50, anywhere on the line (also right after "
                  "the words of a flag that takes several); precedence: defaults < --config "
                  "file < flags < overrides")


@dataclass(frozen=True)
class Flag:
    """One command-line flag that sets one config key."""

    # The flag as typed, e.g. --top-p.
    flag: str
    # The dotted config key it sets, e.g. sampling.top_p; that field's comment is its help.
    key: str
    # What argparse turns each word into (int, float); None keeps the text.
    type: Callable[[str], Any] | None = None
    # "+" for a flag followed by one or more words (the key is then a list).
    nargs: str | None = None
    # The word's placeholder in --help (argparse's default: the flag's name in capitals).
    metavar: str | None = None
    # Let argparse offer and check the field's registered choices (a `choice` field).
    choices: bool = False
    # A switch: the flag takes no word and sets the key to this value.
    const: Any = None
    # Turns the word into the config value, e.g. a comma-separated list; called with the
    # word and the flag, it raises BadInput naming the flag.
    convert: Callable[[Any, str], Any] | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Command:
    """One ``es-llm`` subcommand. ``es_llm.cli`` parses the line, resolves the config with
    ``load`` (or prints it for --print-config) and hands both to ``run``."""

    # Its line in `es-llm --help`.
    help: str
    # The paragraph `es-llm NAME --help` opens with (kept as written, line breaks and all).
    description: str
    # Its config dataclass as module:Class, imported only when the command is named.
    config: str
    # The work: run(args, cfg) with the parsed arguments and the resolved config.
    run: Callable[[argparse.Namespace, Any], None]
    # The flags that set config keys, in the order --help lists them.
    flags: tuple[Flag, ...] = ()
    # Adds the options that set no config key (--resume, --size), if it has any.
    options: Callable[[argparse.ArgumentParser], None] | None = None
    # load(args, config class, the flags' values) -> the resolved config; None: defaults <
    # --config file < flags < overrides.
    load: Callable[[argparse.Namespace, type, dict], Any] | None = None
    # Whether it writes into --out and so needs one (its --help says so).
    out_required: bool = False
    # A line --help-config prints under its heading.
    note: str = ""

    def config_class(self) -> type:
        return named(self.config)

    def resolve(self, args: argparse.Namespace) -> Any:
        """The config this invocation runs with."""
        cls, flags = self.config_class(), flag_values(args, self.flags)
        if self.load is not None:
            return self.load(args, cls, flags)
        from es_llm.config import load_config

        return load_config(cls, path=args.config, flags=flags, overrides=args.overrides)


def named(spec: str) -> Any:
    """The object ``module:name`` names, its module imported now."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def writes_out(job: str) -> Callable[[argparse.Namespace, Any], None]:
    """The ``run`` of a command whose work is one function, ``job(cfg, out, progress=...,
    on_folder=...)``, that writes into the required --out; ``job`` is ``module:function``,
    imported when the command runs."""

    def run(args: argparse.Namespace, cfg: Any) -> None:
        named(job)(cfg, required_out(args), progress=not args.no_progress,
                   on_folder=args.log.attach)

    return run


# --- the parser ---------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser, name: str, command: Command) -> None:
    """Every argument of ``es-llm NAME``: its flags, its other options, the common ones."""
    from es_llm.config import field_choices
    from es_llm.config_help import key_field

    cls = command.config_class()
    for f in command.flags:
        field, comment = key_field(cls, f.key)
        kwargs: dict[str, Any] = {"dest": f.dest, "help": comment.replace("%", "%%")}
        if f.const is not None:
            kwargs.update(action="store_const", const=f.const)
        else:
            kwargs.update(type=f.type, nargs=f.nargs, metavar=f.metavar)
        if f.choices:
            kwargs["choices"] = field_choices(field)
        p.add_argument(f.flag, **kwargs)
    if command.options is not None:
        command.options(p)
    _add_common(p, name, command)


class ConfigHelp(argparse.Action):
    """``--help-config``: print every config key of the command and exit, like --help."""

    def __init__(self, option_strings, dest, command: Command | None = None, name: str = "",
                 **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.command, self.name = command, name

    def __call__(self, parser, namespace, values, option_string=None):
        from es_llm.config_help import format_config_help

        print(format_config_help(self.command.config_class(), self.name, self.command.note))
        parser.exit()


def _add_common(p: argparse.ArgumentParser, name: str, command: Command) -> None:
    p.add_argument("--config", metavar="FILE.yaml",
                   help="YAML file with config keys (see configs/ for examples)")
    # Checked by the command rather than argparse, so --print-config needs no folder.
    p.add_argument("--out", metavar="DIR",
                   help="output folder (created if missing; files in it are replaced "
                        "atomically)" + ("; required" if command.out_required else ""))
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--verbose", action="store_true",
                   help="show what the libraries (vLLM, transformers, torch, MPI) print; "
                        "without it their messages go to log.txt in the output folder")
    p.add_argument("--print-config", action="store_true",
                   help="print the fully resolved config (defaults, --config file, flags and "
                        "overrides) as YAML and exit without running anything")
    p.add_argument("--help-config", action=ConfigHelp, command=command, name=name,
                   help="list every config key with its type, default, meaning and valid "
                        "choices, and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)


# --- from flags to the config ---------------------------------------------------------------

def flag_values(args: argparse.Namespace, flags: tuple[Flag, ...]) -> dict:
    """The config layer the given flags set, as nested sections (``{"sampling": {"n": 8}}``
    for ``--n 8``); a flag left out (None) sets nothing."""
    out: dict = {}
    for f in flags:
        value = getattr(args, f.dest)
        if value is None:
            continue
        *sections, name = f.key.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = f.convert(value, f.flag) if f.convert else value
    return out


def is_override(word: str) -> bool:
    """Whether a word is a ``key=value`` override of a nested key (``task.limit=5``), as
    opposed to a flag's own word such as ``base=runs/testbed``."""
    return "=" in word and "." in word.split("=", 1)[0]


def trailing_overrides(args: argparse.Namespace, flags: tuple[Flag, ...]) -> list[str]:
    """Take the overrides out of the words of flags that take several: argparse gives such
    a flag every word up to the next option, overrides that follow it too."""
    moved: list[str] = []
    for f in flags:
        words = getattr(args, f.dest)
        if f.nargs is None or f.type is not None or not words:
            continue
        moved += [w for w in words if is_override(w)]
        setattr(args, f.dest, [w for w in words if not is_override(w)] or None)
    return moved


def comma_names(text: str, flag: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``: a comma-separated list of names."""
    return [x.strip() for x in text.split(",") if x.strip()]


def comma_ints(text: str, flag: str) -> list[int]:
    """``"2,4,8"`` -> ``[2, 4, 8]``; BadInput naming ``flag`` when a part is no integer."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise BadInput(f"{flag} {text!r} must be a comma-separated list of positive integers, "
                       f"e.g. 2,4,8.") from None


def required_out(args: argparse.Namespace) -> str:
    if not args.out:
        raise BadInput(f"{args.command} needs --out DIR, the folder its results go to.")
    return args.out


def training_load(what: str, resume_keys: tuple[str, ...]):
    """The ``load`` of a training command: a new run in --out with --config, or the run in
    --resume DIR with its own config.yaml, changed only in ``resume_keys`` (the checks are
    ``es_llm.run_folder.training_folder``'s); a testbed model brings its training prompts.
    ``what`` names the run in errors ("an ES" run folder)."""

    def load(args: argparse.Namespace, cls: type, flags: dict):
        from es_llm.config import load_config
        from es_llm.models import resolve_training_data
        from es_llm.run_folder import training_folder

        _, path = training_folder(args, what, args.command, resume_keys, flags)
        return resolve_training_data(load_config(cls, path=path, flags=flags,
                                                 overrides=args.overrides))

    return load


def training_out(args: argparse.Namespace) -> Path:
    """A training command's run folder, once ``training_load`` has accepted it."""
    return Path(args.resume or args.out)


# Rows several commands share: the model, the task's problems, and how eval and compare
# sample (the fields of TaskConfig and SamplingConfig).
MODEL = Flag("--model", "model")
BACKEND = Flag("--backend", "backend", choices=True)
TASK = (Flag("--task", "task.name"), Flag("--data", "task.data"),
        Flag("--select", "task.select", metavar="START:STOP"),
        Flag("--limit", "task.limit", type=int))
# eval and compare: refuse evaluation problems a compared run trained on.
STRICT = Flag("--strict-overlap", "strict_overlap", const=True)
SAMPLING = (Flag("--n", "sampling.n", type=int),
            Flag("--temperature", "sampling.temperature", type=float),
            Flag("--top-p", "sampling.top_p", type=float),
            Flag("--max-tokens", "sampling.max_tokens", type=int),
            Flag("--seed", "sampling.seed", type=int))
