"""The ``es-llm`` command line: one subcommand per job.

Every subcommand is a ``es_llm.command.Command`` registered under the ``es_llm.commands``
entry point group (setup.cfg); this module discovers them there and imports none, so the
core's commands and those of packages built on it (gradient) are found the same way. Each
takes ``--config FILE.yaml`` and ``key=value`` overrides (dotted keys for nested fields)
beside its flags; precedence is defaults < --config file < flags < overrides.
Exit status: 0 success, 2 bad input (config, paths, data), 1 anything else.
"""

from __future__ import annotations

import argparse
import sys

from es_llm.command import Command, add_arguments, trailing_overrides
from es_llm.errors import BadInput, NonFinite, exit_status

GROUP = "es_llm.commands"


def registered_commands() -> dict[str, Command]:
    """Every ``es-llm`` subcommand by name, from the installed packages' entry points."""
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name)}


def _discover() -> tuple[dict[str, Command], str | None]:
    """The registered commands, or what is wrong with their registration."""
    try:
        commands = registered_commands()
    except ImportError as exc:
        return {}, f"a subcommand registered under {GROUP!r} does not import ({exc})"
    odd = sorted(name for name, c in commands.items() if not isinstance(c, Command))
    if odd:
        return {}, f"{', '.join(odd)} under {GROUP!r}: not an es_llm.command.Command"
    return commands, None if commands else f"no subcommand is registered under {GROUP!r}"


def build_parser(commands: dict[str, Command], argv: list[str]) -> argparse.ArgumentParser:
    """The parser of ``es-llm ARGV``. Every command is listed, but only the one ``argv``
    names gets its arguments: their help is read from its config dataclasses, and describing
    every command would import every command's config (torch, transformers) to run one."""
    parser = argparse.ArgumentParser(
        prog="es-llm",
        description="Post-train language models with Evolution Strategies or gradient RL, "
                    "and compare them on shared rewards and metrics.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = next((word for word in argv if not word.startswith("-")), None)
    for name, command in commands.items():
        p = sub.add_parser(name, help=command.help, description=command.description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == named:
            add_arguments(p, name, command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    commands, problem = _discover()
    if problem:
        # The entry points are read from the installed metadata, written at install time.
        print(f"es-llm: {problem}; if the package changed since it was installed, reinstall "
              f"it (pip install -e .).", file=sys.stderr)
        return 1
    parser = build_parser(commands, argv)
    # key=value overrides may stand anywhere, also after options (argparse alone would stop
    # collecting positionals at the first option that follows them).
    args, extra = parser.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    command = commands[args.command]
    args.overrides = [*args.overrides, *extra, *trailing_overrides(args, command.flags)]
    from es_llm.logs import LibraryLog

    args.log = LibraryLog(verbose=args.verbose or args.print_config).start()
    status, message = 1, None
    try:
        cfg = command.resolve(args)
        if args.print_config:
            from es_llm.config import dump_yaml

            print(dump_yaml(cfg), end="")
        else:
            command.run(args, cfg)
        status = 0
    except (BadInput, NonFinite) as exc:
        status, message = exit_status(exc), f"es-llm {args.command}: error: {exc}"
    except KeyboardInterrupt:
        message = f"es-llm {args.command}: interrupted"
    finally:
        args.log.finish(status)
    if message:
        print(message, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
