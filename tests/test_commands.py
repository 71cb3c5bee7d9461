"""Every ``es-llm`` subcommand is one registered Command whose flags are a table of config
keys: each flag's help is its field's comment, each flag sets exactly the key its row names,
and the command line finds the commands through their entry points only."""

from __future__ import annotations

import argparse
import ast
import configparser
import re
from pathlib import Path

import pytest
import yaml

from es_llm.cli import main, registered_commands
from es_llm.command import (Command, add_arguments, comma_ints, comma_names, flag_values,
                            is_override)
from es_llm.config import field_choices
from es_llm.config_help import config_keys, key_field
from es_llm.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = registered_commands()
ROWS = [(name, f) for name, command in COMMANDS.items() for f in command.flags]


def declared_entry_points() -> dict[str, str]:
    """setup.cfg's ``es_llm.commands`` entry points: name -> module:object."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.entry_points"]["es_llm.commands"].strip().splitlines()
    return dict((part.strip() for part in line.split("=")) for line in lines)


def command_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"es-llm {name}")
    add_arguments(p, name, COMMANDS[name])
    return p


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_the_installed_commands_are_the_ones_setup_cfg_declares():
    # A stale install (metadata from before a command was added) fails here, not in use:
    # reinstall with `pip install -e .`.
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group="es_llm.commands")}
    assert installed == declared_entry_points(), "reinstall the package: pip install -e ."
    assert all(isinstance(c, Command) for c in COMMANDS.values())
    assert {"testbed", "eval", "es", "compare", "testtime", "grpo", "opd", "sft",
            "latent-revise"} == set(COMMANDS)


def test_the_command_line_imports_no_command_module():
    tree = ast.parse((ROOT / "es_llm" / "cli.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    modules = {value.split(":")[0] for value in declared_entry_points().values()}
    assert not imported & modules
    assert not {m for m in imported if m.split(".")[0] == "gradient"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_gives_every_flag_its_fields_comment_and_no_restated_default(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    text = "".join(capsys.readouterr().out.split())
    cls = COMMANDS[name].config_class()
    helps = {a.option_strings[0]: a.help for a in command_parser(name)._actions
             if a.option_strings}
    for f in COMMANDS[name].flags:
        comment = key_field(cls, f.key)[1]
        assert comment, f"{f.key} has no comment"
        assert helps[f.flag].replace("%%", "%") == comment
        # Whitespace aside (wrapping may also break a line after a hyphen), it is shown.
        assert f.flag in text and "".join(comment.split()) in text, (f.flag, comment)
    assert not [h for h in helps.values() if h and re.search(r"\(default\b", h)]


def sample(name: str, f) -> tuple[list[str], object]:
    """Words that give flag ``f`` of command ``name`` a value, and that value."""
    if f.const is not None:
        return [f.flag], f.const
    if f.choices:
        last = field_choices(key_field(COMMANDS[name].config_class(), f.key)[0])[-1]
        return [f.flag, last], last
    if f.convert is not None:
        return [f.flag, " 2, 4"], {comma_names: ["2", "4"], comma_ints: [2, 4]}[f.convert]
    word, value = {int: ("17", 17), float: ("0.25", 0.25), None: ("a=b", "a=b")}[f.type]
    if f.nargs == "+":
        return [f.flag, word, word], [value, value]
    return [f.flag, word], value


def type_text(value) -> str:
    if isinstance(value, list):
        return f"tuple[{type(value[0]).__name__}, ...]"
    return type(value).__name__


@pytest.mark.parametrize("name, f", ROWS, ids=[f"{n} {f.flag}" for n, f in ROWS])
def test_every_flag_sets_exactly_the_key_its_row_names(name, f):
    # The flag is named after its key: the field (--top-p), its section (--task for
    # task.name) or both (--budget-runs for budget.runs).
    parts = f.key.split(".")
    assert f.dest in {parts[0], parts[-1], "_".join(parts)}
    words, value = sample(name, f)
    args = command_parser(name).parse_args(words)
    assert flat(flag_values(args, COMMANDS[name].flags)) == {f.key: value}
    # The value has the type of that field.
    entry = {k["key"]: k for k in config_keys(COMMANDS[name].config_class())}[f.key]
    assert entry["type"].removesuffix(" | None") == type_text(value)


def test_flag_values_nest_and_leave_out_what_was_not_given():
    args = command_parser("eval").parse_args(["--n", "8", "--top-p", "0.5", "--task",
                                              "math"])
    assert flag_values(args, COMMANDS["eval"].flags) == {
        "task": {"name": "math"}, "sampling": {"n": 8, "top_p": 0.5}}


def test_overrides_may_follow_the_words_of_a_list_flag(capsys):
    assert main(["compare", "--models", "base=x", "task.limit=5", "es@0=y", "--also-on",
                 "a.jsonl", "sampling.n=3", "--print-config", "bootstrap=20"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["models"] == ["base=x", "es@0=y"] and cfg["also_on"] == ["a.jsonl"]
    assert (cfg["task"]["limit"], cfg["sampling"]["n"], cfg["bootstrap"]) == (5, 3, 20)


def test_an_override_is_a_dotted_key_with_a_value():
    assert is_override("task.limit=5") and is_override("a.b=c=d")
    assert not is_override("base=runs/x.y") and not is_override("runs/a.jsonl")


def test_comma_lists():
    assert comma_names(" a, b,,c ", "--methods") == ["a", "b", "c"]
    assert comma_ints("2,4,8", "--budgets") == [2, 4, 8]
    with pytest.raises(BadInput, match="--budgets '2,x' must be a comma-separated list"):
        comma_ints("2,x", "--budgets")


def test_probe_sigmas():
    from es_llm.es.command import probe_sigmas

    assert probe_sigmas("0.001,0.01") == [0.001, 0.01]
    for text in ("0,0.1", "-1", "nan", "inf", "", "a"):
        with pytest.raises(BadInput, match="--probe-sigma"):
            probe_sigmas(text)


def test_key_field_refuses_a_key_the_config_does_not_have():
    from es_llm.evaluate import EvalConfig

    assert key_field(EvalConfig, "sampling.n")[1].startswith("Samples per problem")
    for key in ("sampling.nn", "model.x", "nope"):
        with pytest.raises(ValueError, match="names no config key"):
            key_field(EvalConfig, key)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_prints_its_config_and_its_keys_without_running(name, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([name, "--print-config"]) == 0
    assert isinstance(yaml.safe_load(capsys.readouterr().out), dict)
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help-config"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"Config keys of `es-llm {name}`")
    assert not list(tmp_path.iterdir())


def test_no_registered_command_is_an_install_problem(monkeypatch, capsys):
    monkeypatch.setattr("es_llm.cli.registered_commands", lambda: {})
    assert main(["eval"]) == 1
    assert "no subcommand is registered" in capsys.readouterr().err

    def stale():
        raise ModuleNotFoundError("No module named 'gradient.old_cli'")

    monkeypatch.setattr("es_llm.cli.registered_commands", stale)
    assert main(["eval"]) == 1
    err = capsys.readouterr().err
    assert "gradient.old_cli" in err and "reinstall it (pip install -e .)" in err
    assert err.count("\n") == 1
    monkeypatch.setattr("es_llm.cli.registered_commands", lambda: {"grpo": object()})
    assert main(["grpo"]) == 1
    assert "grpo under 'es_llm.commands': not an es_llm.command.Command" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if c.out_required))
def test_a_command_that_writes_into_out_refuses_to_run_without_it(name, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([name]) == 2
    assert f"{name} needs --out DIR" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
