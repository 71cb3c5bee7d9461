"""The layout's dependency rules hold: populations is model-free, the core never imports
gradient, and MPI / vLLM / torch.distributed stay behind their edge modules."""

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


@pytest.mark.parametrize("package, banned", [
    ("populations", {"es_llm", "gradient", "transformers", "vllm", "mpi4py"}),
    ("es_llm", {"gradient"}),
])
def test_import_direction(package, banned):
    offenders = [(str(p.relative_to(ROOT)), m) for p in py_files(package)
                 for m in imported_modules(p) if top(m) in banned]
    assert not offenders, f"{package} must not import {sorted(banned)}: {offenders}"


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
