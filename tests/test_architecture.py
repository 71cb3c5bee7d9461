"""The layout's dependency rules hold: populations is model-free, the core never imports
gradient, scripts/ sit on top (nothing imports them), only the console script imports the
command line, and MPI / vLLM / torch.distributed stay behind their edge modules; and no
production function, class or method is there for tests alone."""

from __future__ import annotations

import ast
import re
from collections import Counter
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


# The packages whose every function, class and method needs a production caller (one tuple,
# so a package joins the rule by one entry).
PRODUCTION = ("es_llm", "populations", "gradient", "scripts")
# Where a production caller may live: every package (gradient builds on es_llm) and setup.cfg.
CALLERS = ("es_llm", "populations", "scripts", "gradient")
# Files whose definitions need no production caller (none today; one entry adds a file).
EXEMPT: tuple[str, ...] = ()
# Methods a library calls on a subclass without naming them in this code: torch's
# Module.__call__ runs forward.
LIBRARY_HOOKS = ("forward",)
# A whole string that names code: an identifier, a dotted path or an entry point's module:attr.
CODE_PATH = re.compile(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?")


def definitions(tree: ast.Module) -> list[ast.AST]:
    """The module-level functions and classes of ``tree`` and the methods of its classes."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    found = []
    for node in tree.body:
        if isinstance(node, kinds):
            found.append(node)
        if isinstance(node, ast.ClassDef):
            found += [n for n in node.body if isinstance(n, kinds[:2])]
    return found


def called_unnamed(node: ast.AST, script: bool) -> bool:
    """Definitions used without their name appearing in code: dunders (Python calls them),
    library hooks, decorated functions (a registry, property, context manager or no_grad
    wrapper holds them) and a script's main."""
    if node.name.startswith("__") and node.name.endswith("__") or node.name in LIBRARY_HOOKS:
        return True
    if isinstance(node, ast.ClassDef):
        return False
    return bool(node.decorator_list) or (script and node.name == "main")


def references(tree: ast.AST) -> Counter:
    """How often each name is used in ``tree``: as an ast.Name, an ast.Attribute or an
    identifier of a string that names code (registry keys, entry points); docstrings are
    prose, and an import (a re-export too) is no use by itself."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    names = Counter()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            names[n.id] += 1
        elif isinstance(n, ast.Attribute):
            names[n.attr] += 1
        elif (isinstance(n, ast.Constant) and isinstance(n.value, str)
              and id(n) not in docstrings and CODE_PATH.fullmatch(n.value)):
            names.update(re.findall(r"\w+", n.value))
    return names


def parsed(root: Path, packages: tuple[str, ...]) -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for package in packages
            for p in sorted((root / package).rglob("*.py"))}


def only_tests_call(root: Path, production: tuple[str, ...], callers: tuple[str, ...],
                    exempt: tuple[str, ...] = ()) -> list[str]:
    """``path:name`` of every definition in ``production`` whose name appears nowhere in the
    ``callers`` packages or setup.cfg but in its own definition, while tests/ use it.
    Methods match by name, so one implementing a protocol that its callers reach through
    the base type counts as called."""
    trees = parsed(root, callers)
    used = sum((references(t) for t in trees.values()), Counter())
    cfg = root / "setup.cfg"
    used.update(re.findall(r"\w+", cfg.read_text()) if cfg.is_file() else [])
    tested = sum((references(t) for t in parsed(root, ("tests",)).values()), Counter())
    found = []
    for path, tree in trees.items():
        rel = path.relative_to(root)
        if rel.parts[0] not in production or str(rel) in exempt:
            continue
        for node in definitions(tree):
            if called_unnamed(node, rel.parts[0] == "scripts") or not tested[node.name]:
                continue
            # A call from inside its own body (recursion) is not a caller.
            if used[node.name] == references(node)[node.name]:
                found.append(f"{rel}:{node.name}")
    return found


def test_no_production_function_only_tests_call():
    found = only_tests_call(ROOT, PRODUCTION, CALLERS, EXEMPT)
    assert not found, ("only tests call these; wire them into the code that re-implements "
                       f"them, or delete them with their tests: {found}")


def test_the_caller_check_flags_a_function_only_a_test_calls(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "pkg" / "maths.py").write_text(
        '"""pkg.maths:perimeter"""\n'
        "def used():\n    return 1\n"
        "def tested_only(n):\n    return tested_only(n - 1) if n else 0\n"
        "def by_entry_point():\n    return 2\n"
        "class Shape:\n    def area(self):\n        return used()\n"
        "    def perimeter(self):\n        return 0\n"
        "def run():\n    return Shape().area()\n")
    (tmp_path / "setup.cfg").write_text("[options.entry_points]\nx = pkg.maths:by_entry_point\n")
    (tmp_path / "tests" / "test_maths.py").write_text(
        "from pkg.maths import Shape, by_entry_point, tested_only, used\n"
        "def test_all():\n    assert used() + tested_only(2) + by_entry_point() == 3\n"
        "    assert Shape().area() == 1 and Shape().perimeter() == 0\n")
    assert only_tests_call(tmp_path, ("pkg",), ("pkg",)) == [
        "pkg/maths.py:tested_only", "pkg/maths.py:perimeter"]
    assert only_tests_call(tmp_path, ("pkg",), ("pkg",), ("pkg/maths.py",)) == []
