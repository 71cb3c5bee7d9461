"""The layout's dependency rules hold: populations is model-free, the core never imports
gradient, scripts/ sit on top (nothing imports them), only the console script imports the
command line, and MPI / vLLM / torch.distributed stay behind their edge modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def py_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


def script_modules() -> set[str]:
    """What scripts/ can be imported as: the folder, and each script by its own name (a
    script run from there imports its siblings so, e.g. minimal_grpo imports minimal_es)."""
    return {"scripts"} | {p.stem for p in py_files("scripts")}


@pytest.mark.parametrize("package, banned", [
    ("populations", {"es_llm", "gradient", "transformers", "vllm", "mpi4py"}),
    ("es_llm", {"gradient"}),
    ("gradient", set()),
])
def test_import_direction(package, banned):
    # scripts/ sit on top of everything: they may import es_llm and gradient, and nothing
    # in the packages imports a script.
    banned = banned | script_modules()
    offenders = [(str(p.relative_to(ROOT)), m) for p in py_files(package)
                 for m in imported_modules(p) if top(m) in banned]
    assert not offenders, f"{package} must not import {sorted(banned)}: {offenders}"


def gradient_imports(folder: str, found) -> list[tuple[str, str]]:
    """(file, module) for each import of a gradient module by a file under ``folder`` that
    ``found(module)`` picks."""
    return [(str(p.relative_to(ROOT)), m) for p in py_files(folder)
            for m in imported_modules(p) if top(m) == "gradient" and found(m)]


def test_gradient_layers_import_downwards():
    # gradient/ shows its layers: the maths import no other part of gradient, and no module
    # outside the commands imports one (the core finds them through their entry points).
    maths = gradient_imports("gradient/maths", lambda m: not m.startswith("gradient.maths"))
    assert not maths, f"gradient/maths must import nothing else of gradient: {maths}"
    commands = [(f, m) for f, m in gradient_imports(
        "gradient", lambda m: m.startswith("gradient.commands"))
        if not f.startswith("gradient/commands/")]
    assert not commands, f"only gradient/commands may import a command: {commands}"


def test_only_the_console_script_imports_the_command_line():
    # Commands are discovered through their entry points; the shared parts they need are in
    # es_llm/command.py. es_llm/__main__.py is `python -m es_llm`, the console script.
    offenders = [str(p.relative_to(ROOT))
                 for package in ("populations", "es_llm", "gradient", "scripts")
                 for p in py_files(package)
                 if p != ROOT / "es_llm" / "__main__.py"
                 and ("es_llm.cli" in imported_modules(p) or imports_name(p, "es_llm", "cli"))]
    assert not offenders, f"only the console script may import es_llm.cli: {offenders}"


def imports_name(path: Path, module: str, name: str) -> bool:
    """Whether ``path`` has ``from module import name``."""
    return any(isinstance(node, ast.ImportFrom) and node.module == module
               and any(a.name == name for a in node.names)
               for node in ast.walk(ast.parse(path.read_text())))


def test_transport_imports_stay_at_the_edges():
    allowed = {"es_llm/backends", "es_llm/comm"}
    offenders = []
    for package in ("es_llm", "populations", "gradient"):
        for p in py_files(package):
            rel = str(p.relative_to(ROOT))
            if any(rel.startswith(a) for a in allowed):
                continue
            for m in imported_modules(p):
                if top(m) in {"vllm", "mpi4py"} or m.startswith("torch.distributed"):
                    offenders.append((rel, m))
    assert not offenders, f"vllm/mpi4py/torch.distributed imported outside the edges: {offenders}"


def test_checker_sees_imports(tmp_path):
    # The checks above only mean something if the parser finds imports in all their forms.
    f = tmp_path / "m.py"
    f.write_text("import gradient.x\nfrom es_llm import y\ndef f():\n    import vllm\n")
    assert imported_modules(f) == {"gradient.x", "es_llm", "vllm"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, at the top or inside a function (a
    late import hides a circle, it does not remove it). ``from a import b`` counts as an
    import of the module ``a.b`` when that is one, else of ``a``."""
    modules = {module_name(p): p for p in py_files(package)}
    # A script imports its siblings by their own names (scripts/ is its sys.path entry).
    siblings = {p.stem: module_name(p) for p in py_files(package)} if package == "scripts" else {}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                             else node.module for a in node.names)
        found = {siblings.get(m, m) for m in found}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


@pytest.mark.parametrize("package", ["populations", "es_llm", "gradient", "scripts"])
def test_no_package_has_an_import_circle(package):
    # Between packages the imports go one way (test_import_direction), so no circle inside
    # any package means none in the whole tree.
    found = cycle(import_graph(package))
    assert found is None, f"import circle in {package}/: {' -> '.join(found)}"


def test_the_circle_finder_finds_a_late_import_circle(tmp_path):
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
