"""Per-role held-out figures of a multi-role model (greedy decoding).

    python scripts/role_accuracy.py --model runs/testbed/reasoning [--data FILE] \
        [--limit N] [--seed 0] [--out roles.json]

Reads the model's held-out data/countdown_eval.jsonl unless --data is given and prints, per
role, what es_llm/testtime/role_accuracy.py measures: solve, direct and facts accuracy,
the reviewer's precision and recall on clean traces and traces with planted errors, and
the share of planted errors the revise role repairs under each critique, and how often the
formalize role's statements parse, are faithful and check, for right and wrong answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from es_llm.errors import BadInput


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the multi-role model folder")
    ap.add_argument("--data", help="problems file (default: the model's countdown_eval.jsonl)")
    ap.add_argument("--limit", type=int, help="use only the first LIMIT problems")
    ap.add_argument("--seed", type=int, default=0, help="seed of the planted errors")
    ap.add_argument("--out", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    try:
        from es_llm.backends import BackendSpec, make_backend
        from es_llm.io import write_json_atomic
        from es_llm.models import check_model_path
        from es_llm.tasks import TaskConfig, build_task
        from es_llm.testtime.role_accuracy import role_accuracy
        from es_llm.testtime.roles import check_roles

        check_model_path(args.model)
        check_roles(args.model, {"role_accuracy": ("solve", "direct", "facts", "review",
                                                   "revise", "formalize")})
        data = args.data or str(Path(args.model) / "data" / "countdown_eval.jsonl")
        task = build_task(TaskConfig(name="countdown", data=data, limit=args.limit))
        problems = task.problems()
        if any("reference" not in p.meta for p in problems):
            raise BadInput(f"{data!r}: every problem needs a worked 'reference' solution (the "
                           f"testbed's held-out files and scripts/unseen_countdown.py have one).")
        backend = make_backend(BackendSpec(args.model, backend="hf"))
        figures = role_accuracy(backend, problems, seed=args.seed)
    except BadInput as exc:
        print(f"role_accuracy: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write_json_atomic(args.out, figures)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
