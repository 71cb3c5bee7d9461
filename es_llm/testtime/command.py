"""The ``es-llm testtime`` subcommand's flags and how they become config values."""

from __future__ import annotations

import argparse
import textwrap

from es_llm.errors import BadInput


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise BadInput(f"{flag} {text!r} must be a comma-separated list of positive integers, "
                       f"e.g. 2,4,8.") from None


def flags(args) -> dict:
    """The config values the flags set (``TestTimeConfig`` keys)."""
    out: dict = {}
    if args.model is not None:
        out["model"] = args.model
    task = {k: v for k, v in (("name", args.task), ("data", args.data), ("limit", args.limit))
            if v is not None}
    if task:
        out["task"] = task
    if args.methods is not None:
        out["methods"] = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.budgets is not None:
        out["budgets"] = _int_list(args.budgets, "--budgets")
    for key in ("backend", "seed"):
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    return out


def add_parser(sub, add_common) -> None:
    from es_llm.testtime.methods import METHODS
    from es_llm.testtime.run import TestTimeConfig  # noqa: F401  (registers every method)

    p = sub.add_parser(
        "testtime", help="test-time methods on one model, priced in generated tokens",
        description=textwrap.dedent("""\
            Run test-time methods on a model and report success against tokens per problem:
            independent sampling (solve), direct answers, cpp (facts, then solve), dart (two
            direct drafts, solve on disagreement with a calibrated thinking budget), ttel
            (localise the error of a failed trajectory, cut and branch), base_select
            (formalise one candidate, edit the rest, check), per (plan, execute, review,
            repair) and broadcast (peers solve, review each other, repair). Every method
            but independent needs the multi-role reasoning model (`es-llm testbed
            reasoning.enabled=true`, folder reasoning/). Writes DIR/samples.jsonl,
            outcomes.jsonl, metrics.json, report.md and figures/success_vs_tokens.png."""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (e.g. a testbed build's reasoning/)")
    p.add_argument("--task", help="task name: countdown (the only one with roles)")
    p.add_argument("--data", help="problems file (default: the model's data/countdown_eval.jsonl)")
    p.add_argument("--limit", type=int, help="use only the first LIMIT problems")
    p.add_argument("--methods", metavar="M1,M2,...",
                   help="methods to run, from " + ", ".join(METHODS.names())
                        + " (default all)")
    p.add_argument("--budgets", metavar="B1,B2,...",
                   help="budget levels in each method's unit: samples, thinking samples, "
                        "branches, candidates, pipelines or peers (default 2,4,8)")
    p.add_argument("--backend", choices=["auto", "hf", "vllm"],
                   help="generation backend (default hf; ttel always scores with transformers)")
    p.add_argument("--seed", type=int, help="sampling seed (default 0)")
    add_common(p, out_required=True, config="es_llm.testtime.run:TestTimeConfig")
