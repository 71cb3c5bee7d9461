"""Which roles a model folder was built with (``roles.json``), and which each method needs.

The reasoning testbed model writes ``roles.json``; any other model (the student, a
checkpoint trained from it, an outside model) knows only ``solve``, the plain task prompt.
A training run that starts from the reasoning model copies the file with the rest of the
folder, so its checkpoints keep their roles.
"""

from __future__ import annotations

import json
from pathlib import Path

from es_llm.errors import BadInput
from es_llm.io import write_json_atomic
from es_llm.tasks.countdown_roles import ROLES

ROLES_FILE = "roles.json"


def write_roles(folder: Path, roles) -> None:
    write_json_atomic(Path(folder) / ROLES_FILE, {"roles": list(roles)})


def model_roles(folder: str | Path) -> tuple[str, ...]:
    """The roles of the model in ``folder``: its ``roles.json``, else ``("solve",)``."""
    path = Path(folder) / ROLES_FILE
    if not path.is_file():
        return ("solve",)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        data = exc
    roles = data.get("roles") if isinstance(data, dict) else None
    if not (isinstance(roles, list) and all(isinstance(r, str) for r in roles)):
        raise BadInput(f"{path} is not a roles file: it should hold a JSON object "
                       f'{{"roles": [...]}} listing role names from {", ".join(ROLES)}.')
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise BadInput(f"{path} names unknown roles {unknown}; valid roles are: "
                       f"{', '.join(ROLES)}.")
    return tuple(roles)


def check_roles(folder: str | Path, needs: dict[str, tuple[str, ...]]) -> None:
    """BadInput naming every method whose roles the model in ``folder`` was not built with."""
    have = set(model_roles(folder))
    missing = {m: [r for r in roles if r not in have] for m, roles in needs.items()}
    missing = {m: r for m, r in missing.items() if r}
    if missing:
        detail = "; ".join(f"{m} needs {', '.join(r)}" for m, r in missing.items())
        runnable = [m for m in needs if m not in missing]
        raise BadInput(f"model {str(folder)!r} was built with the roles {', '.join(sorted(have))} "
                       f"only: {detail}. Build the multi-role model with `es-llm testbed "
                       f"--size default reasoning.enabled=true` and use its reasoning/ folder, "
                       f"or choose methods this model can run"
                       + (f" ({', '.join(runnable)})." if runnable else "."))
