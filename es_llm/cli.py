"""The ``es-llm`` command line: one subcommand per job.

Each subcommand takes ``--config FILE.yaml`` and ``key=value`` overrides (dotted keys for
nested fields) beside its flags; precedence is defaults < --config file < flags < overrides
(``es_llm.config.load_config``).
Exit status: 0 success, 2 bad input (config, paths, data), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import traceback
from pathlib import Path

from es_llm.errors import BadInput, NonFinite, exit_status
from es_llm.testbed import SIZES

# What `es-llm es --resume` may override: the run's length and its checkpoint, checksum and
# timeout cadence, none of which changes the weights it computes.
ES_RESUME_KEYS = ("iterations", "checkpoint_every", "checksum_every", "comm_timeout_s")

OVERRIDES_HELP = ("config overrides as key=value with dotted keys for nested fields, e.g. "
                  "sampling.top_p=0.95 task.limit=50; precedence: defaults < --config file < "
                  "flags < overrides")


def config_class(spec: str) -> type:
    """The config dataclass named ``module:Class`` (imported only when asked for)."""
    import importlib

    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


class ConfigHelp(argparse.Action):
    """``--help-config``: print every config key of the command and exit, like --help."""

    def __init__(self, option_strings, dest, config: str = "", command: str = "", note: str = "",
                 **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.config, self.command, self.note = config, command, note

    def __call__(self, parser, namespace, values, option_string=None):
        from es_llm.config_help import format_config_help

        print(format_config_help(config_class(self.config), self.command, self.note))
        parser.exit()


def _add_common(p: argparse.ArgumentParser, out_required: bool, config: str = "",
                note: str = "") -> None:
    """The options every subcommand has; ``config`` names its config dataclass
    (``module:Class``) for --help-config, ``note`` adds a line to that listing."""
    p.add_argument("--config", metavar="FILE.yaml",
                   help="YAML file with config keys (see configs/ for examples)")
    # Checked by the command rather than argparse, so --print-config needs no folder.
    p.add_argument("--out", metavar="DIR",
                   help="output folder (created if missing; files in it are replaced "
                        "atomically)" + ("; required" if out_required else ""))
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--verbose", action="store_true",
                   help="show what the libraries (vLLM, transformers, torch, MPI) print; "
                        "without it their messages go to log.txt in the output folder")
    p.add_argument("--print-config", action="store_true",
                   help="print the fully resolved config (defaults, --config file, flags and "
                        "overrides) as YAML and exit without running anything")
    p.add_argument("--help-config", action=ConfigHelp, config=config,
                   command=p.prog.split()[-1], note=note,
                   help="list every config key with its type, default, meaning and valid "
                        "choices, and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)


def required_out(args) -> str:
    if not args.out:
        raise BadInput(f"{args.command} needs --out DIR, the folder its results go to.")
    return args.out


def print_config(cfg) -> None:
    """--print-config: the resolved config as YAML on standard output."""
    from es_llm.config import dump_yaml

    print(dump_yaml(cfg), end="")


def _add_sampling_flags(p: argparse.ArgumentParser, reference: bool = False) -> None:
    """What and how `eval` and `compare` sample (the fields of EvalConfig)."""
    p.add_argument("--task", help="task name: countdown, arithmetic, math, humaneval, pyfunc "
                                  "or chess (code tasks need bubblewrap, see README)")
    p.add_argument("--data", help="local JSONL/JSON/parquet file of problems for the task "
                                  "(default: a testbed model's own held-out set)")
    p.add_argument("--limit", type=int, help="use only the first LIMIT problems")
    p.add_argument("--n", type=int, help="samples per problem (default 64)")
    p.add_argument("--temperature", type=float, help="sampling temperature, 0 = greedy (default 1.0)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold (default 1.0)")
    p.add_argument("--max-tokens", type=int, help="longest completion in tokens (default 64)")
    p.add_argument("--seed", type=int, help="sampling seed (default 0)")
    if reference:
        p.add_argument("--backend", choices=["auto", "hf", "vllm", "reference"],
                       help="generation backend; auto = vLLM when installed (default auto); "
                            "reference = no model, every problem answered with its own "
                            "reference solution (checks the task's verifier)")
    else:
        p.add_argument("--backend", choices=["auto", "hf", "vllm"],
                       help="generation backend; auto = vLLM when installed (default auto)")


def build_parser(plugins: dict | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="es-llm",
        description="Post-train language models with Evolution Strategies or gradient RL, "
                    "and compare them on shared rewards and metrics.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    tb = sub.add_parser(
        "testbed", help="build (or reuse from the cache) the embedded base model",
        description=textwrap.dedent("""\
            Build the embedded testbed deterministically from its config: held-out problem
            sets (data/countdown_eval.jsonl, countdown_rl.jsonl, arithmetic_eval.jsonl), a
            character-level tokenizer and a small Llama-architecture model pretrained on
            procedurally generated Countdown and arithmetic solutions; then its distillation
            teachers under teachers/: strong (larger, trained longer) and weak_base /
            weak_rl (a smaller model before and after a short REINFORCE run), all with the
            student's tokenizer (teachers.enabled=false skips them; teachers.* sets their
            shapes and schedules). Off unless enabled: a masked-diffusion LM under
            diffusion/ (a BERT encoder trained on masked tokens of the same mix, with its
            sampler settings; diffusion.enabled=true), and domain models of the student's
            family with their own held-out sets: code/ learns the pyfunc task
            (code.enabled=true; scoring needs bubblewrap) and chess/ the chess task
            (chess.enabled=true; needs the Syzygy tables that scripts/setup.sh installs),
            and reasoning/ plays Countdown in the solve, direct, facts, review and revise
            roles that `es-llm testtime` needs (reasoning.enabled=true; roles.json lists
            them); swa/ is the student converted to sliding-window attention (SWARR:
            swa.window keys per query on swa.layers, then SFT on the pretraining mix;
            swa/no_sft/ holds the converted weights before it; swa.enabled=true). Builds are cached by a hash of the config and builder code under $ES_LLM_CACHE
            (default ~/.cache/es-llm), each part on its own key,
            and copied to --out."""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tb.add_argument("--size", choices=SIZES, default="default",
                    help="preset: 'ci' (tiny, about 2.5 minutes with its teachers), 'default' "
                         "(about 7 minutes on 2 cores, plus about 20 for its teachers) or "
                         "'habits' (the default model pretrained with guessed answers among "
                         "its traces, so that post-training can add greedy capability; about "
                         "8 minutes without teachers)")
    _add_common(tb, out_required=False, config="es_llm.testbed.config:TestbedConfig",
                note="Defaults shown are the 'default' size; --size ci or habits starts "
                     "from es_llm/testbed/presets/<size>.yaml instead.")

    ev = sub.add_parser(
        "eval", help="sample a model on a task and report pass@k, coverage and diversity",
        description=textwrap.dedent("""\
            Sample N completions per problem, score them with the task's verifier and write
            DIR/samples.jsonl (one line per sample) and DIR/metrics.json (pass@k for
            k = 1, 2, 4, ... up to N with 95% bootstrap CIs over problems, maj@k, pass^k,
            coverage, diversity). A testbed model is evaluated on its own held-out set
            unless --data is given; other models use the task's generator or --data. A
            masked-diffusion model (a folder with diffusion_sampling.json, such as the
            testbed's diffusion/) decodes with the sampler saved beside it."""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--model", help="Hugging Face model folder (e.g. from `es-llm testbed`; "
                                    "not needed with --backend reference)")
    _add_sampling_flags(ev, reference=True)
    _add_common(ev, out_required=True, config="es_llm.evaluate:EvalConfig")

    es = sub.add_parser(
        "es", help="Evolution Strategies over the model's weights (also under mpirun -n P)",
        description=textwrap.dedent("""\
            Evolve the weights of a model with ES: each iteration every member of the
            population is the base weights plus sigma times keyed Gaussian noise (or, with
            es.kind=lowrank, rank-r noise on every matrix), is scored on the batch of
            training prompts (or es.prompts_per_member of them) with greedy decoding, and
            the weights move along the shaped-reward-weighted noise. Under `mpirun -n P` the
            ranks split the population and exchange only rewards; every rank applies the
            same update. Writes DIR/config.yaml, metrics.jsonl, ledger.jsonl and
            checkpoints/."""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    es.add_argument("--model", help="base model folder (overrides the config's model)")
    es.add_argument("--resume", metavar="DIR",
                    help="continue the run in DIR: its config.yaml is reloaded, its ledger is "
                         "replayed from the base model to rebuild the weights exactly, and it "
                         "goes on from there; only " + ", ".join(ES_RESUME_KEYS)
                         + " may be overridden (e.g. iterations=N to run longer)")
    es.add_argument("--probe-sigma", metavar="S1,S2,...",
                    help="instead of a run: evaluate iteration 0's mirrored pairs at each of "
                         "these sigmas and report how often + and - differ in reward, in "
                         "correctness and in format, and how often they write the same texts; "
                         "writes DIR/probe_sigma.json")
    _add_common(es, out_required=False, config="es_llm.es.config:ESRunConfig")
    cmp = sub.add_parser(
        "compare", help="compare models on the same problems: pass@k, coverage, diversity",
        description=textwrap.dedent("""\
            Sample every model with identical settings and seeds on the same problems (or
            reuse its samples.jsonl), then write DIR/report.md and DIR/report.html with PNG
            figures under DIR/figures/, and DIR/comparison.json with every number in them:
            pass@k for k = 1..n with 95% bootstrap bands and crossovers; coverage, overlaps,
            per-problem accuracy histograms, progressions and regressions against the
            reference model; answer entropy (also on regressions), distinct answers,
            distinct-n, self-BLEU and distinct correct solutions; training curves of the runs
            the checkpoints came from; gains by difficulty (DRG, accuracy per difficulty bin
            of the reference and per tier); with --budget-runs, accuracy along training runs
            against generated samples and training seconds. Several training seeds of one
            method are named method@seed and reported as a group (seed spread beside the
            bootstrap CIs)."""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("--models", nargs="+", metavar="NAME=PATH",
                     help="models to compare: PATH is a model folder (sampled here into "
                          "DIR/samples/NAME), an `es-llm eval` folder or a samples.jsonl "
                          "(reused); NAME is a method or method@seed, e.g. base=runs/testbed "
                          "es@0=runs/es-0/checkpoints/final. key=value overrides with dotted "
                          "keys may follow them")
    cmp.add_argument("--reference", metavar="NAME",
                     help="model or method the others are measured against (default base)")
    _add_sampling_flags(cmp)
    cmp.add_argument("--bootstrap", type=int, help="bootstrap resamples per interval (default 1000)")
    cmp.add_argument("--temperatures", type=float, nargs="+", metavar="T",
                     help="capability or sharpening: also read every model greedily and "
                          "sampled at these temperatures (and --temperature), and report "
                          "greedy accuracy, pass@1, pass@n, entropy and the sharpening gap "
                          "side by side")
    cmp.add_argument("--also-on", nargs="+", metavar="FILE",
                     help="more problem files to read every model on in the same way (e.g. a "
                          "never-seen set from scripts/unseen_countdown.py); turns the "
                          "capability views on")
    cmp.add_argument("--views-n", type=int, metavar="N",
                     help="samples per problem in the sampled capability views (default --n)")
    cmp.add_argument("--budget-runs", nargs="+", metavar="METHOD@SEED=RUN_DIR",
                     help="accuracy against training budget: read every checkpoint saved along "
                          "these `es-llm es` / `es-llm grpo` run folders, and the reference "
                          "model, greedily on the first --also-on file (else the held-out "
                          "problems; budget.data=FILE to choose) and sampled "
                          "(budget.n=4 at budget.temperature=0.6 on every budget.stride=4-th "
                          "problem, pass@budget.k=[1,4]); the report adds a table and a figure "
                          "by generated samples and by training seconds")
    cmp.add_argument("--difficulty-file", metavar="FILE",
                     help="per-problem difficulty for the gains-by-difficulty section (besides "
                          "the reference's failure rate and the tiers): JSONL with an 'id' and "
                          "a number in column difficulty_column (default 'difficulty') for "
                          "every compared problem, e.g. human error rates")
    cmp.add_argument("--blind-spot", action="store_true", default=None,
                     help="the pass@k blind spot: for every model folder, the problems none of "
                          "its first blind_spot.k=6 samples solves, read again greedily and by "
                          "five greedy chains with activations grafted into one layer "
                          "(blind_spot.layer; numbers reordered, a mean activation, another "
                          "prompt); the report adds recovery rates and the fix sets' overlaps")
    cmp.add_argument("--testtime-methods", metavar="M1,M2,...",
                     help="also run these test-time methods (`es-llm testtime`) on every model "
                          "folder at testtime.budgets=[2,4,8] and draw their success against "
                          "tokens together, e.g. independent,base_select for student "
                          "checkpoints")
    _add_common(cmp, out_required=True, config="es_llm.compare.run:CompareConfig")
    from es_llm.testtime import command as testtime_command
    testtime_command.add_parser(sub, _add_common)
    for command in (plugin_commands() if plugins is None else plugins).values():
        command.add_parser(sub, _add_common)
    return parser


def plugin_commands() -> dict:
    """Subcommands that other installed packages register under the ``es_llm.commands`` entry
    point group (the gradient baselines register ``grpo`` and ``opd``). The core discovers
    them at run time instead of importing them, so it never depends on the packages built on
    top of it. Each entry point names an object with ``add_parser(subparsers, add_common)``
    and ``run(args)``."""
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in entry_points(group="es_llm.commands")}


def _eval_flags(args) -> dict:
    base: dict = {}
    if args.model is not None:
        base["model"] = args.model
    task = {k: v for k, v in (("name", args.task), ("data", args.data), ("limit", args.limit))
            if v is not None}
    sampling = {k: v for k, v in (("n", args.n), ("temperature", args.temperature),
                                  ("top_p", args.top_p), ("max_tokens", args.max_tokens),
                                  ("seed", args.seed)) if v is not None}
    if task:
        base["task"] = task
    if sampling:
        base["sampling"] = sampling
    if args.backend is not None:
        base["backend"] = args.backend
    return base


def run_testbed(args) -> None:
    from es_llm.testbed.build import build_testbed, describe
    from es_llm.testbed.config import load_testbed_config

    cfg = load_testbed_config(args.size, args.config, args.overrides)
    if args.print_config:
        return print_config(cfg)
    path, info = build_testbed(cfg, args.out, progress=not args.no_progress)
    if args.out:
        args.log.attach(path)
    print(describe(path, info))


def run_eval(args) -> None:
    from es_llm.config import load_config
    from es_llm.evaluate import EvalConfig, evaluate

    cfg = load_config(EvalConfig, path=args.config, flags=_eval_flags(args),
                      overrides=args.overrides)
    if args.print_config:
        return print_config(cfg)
    evaluate(cfg, required_out(args), progress=not args.no_progress, on_folder=args.log.attach)


def run_compare(args) -> None:
    from es_llm.compare.run import CompareConfig, compare
    from es_llm.config import load_config

    flags = _eval_flags(argparse.Namespace(**{**vars(args), "model": None}))
    models, overrides = [], list(args.overrides)
    for entry in args.models or []:
        # key=value overrides may follow the model list; their keys are dotted.
        (overrides if "." in entry.split("=", 1)[0] else models).append(entry)
    if models:
        flags["models"] = models
    for key in ("reference", "bootstrap", "temperatures", "also_on", "views_n",
                "difficulty_file"):
        if getattr(args, key) is not None:
            flags[key] = getattr(args, key)
    if args.blind_spot:
        flags["blind_spot"] = {"enabled": True}
    if args.testtime_methods:
        flags["testtime"] = {"methods": [m.strip() for m in args.testtime_methods.split(",")
                                         if m.strip()]}
    if args.budget_runs is not None:
        runs = [e for e in args.budget_runs if "." not in e.split("=", 1)[0]]
        overrides += [e for e in args.budget_runs if e not in runs]
        flags["budget"] = {"runs": runs}
    cfg = load_config(CompareConfig, path=args.config, flags=flags, overrides=overrides)
    if args.print_config:
        return print_config(cfg)
    compare(cfg, required_out(args), progress=not args.no_progress, on_folder=args.log.attach)


def run_testtime(args) -> None:
    from es_llm.config import load_config
    from es_llm.testtime.command import flags
    from es_llm.testtime.run import TestTimeConfig, testtime

    cfg = load_config(TestTimeConfig, path=args.config, flags=flags(args),
                      overrides=args.overrides)
    if args.print_config:
        return print_config(cfg)
    testtime(cfg, required_out(args), progress=not args.no_progress, on_folder=args.log.attach)


def run_es(args) -> None:
    from es_llm.comm import make_communicator
    from es_llm.config import load_config
    from es_llm.es.config import ESRunConfig
    from es_llm.es.engine import read_ledger
    from es_llm.models import resolve_training_data
    from es_llm.run_folder import check_extends, other_machine, training_folder

    flags = {"model": args.model} if args.model is not None else {}
    out, config_path = training_folder(args, "an ES", "es", ES_RESUME_KEYS, flags)
    cfg = resolve_training_data(load_config(ESRunConfig, path=config_path, flags=flags,
                                            overrides=args.overrides))
    if args.print_config:
        return print_config(cfg)
    if args.resume:
        check_extends(out, "iterations", cfg.iterations, len(read_ledger(out)))
    comm = make_communicator(cfg.comm_timeout_s)
    warning = other_machine(out) if args.resume and comm.rank == 0 else None
    if warning:
        print(warning, file=sys.stderr)
    try:
        _es_rank(args, cfg, comm, out)
    except BaseException as exc:
        if comm.size == 1:
            raise
        if isinstance(exc, NonFinite):
            # Every rank stopped at the same update together (the engine's barrier): rank 0
            # says why, the others end quietly with the same status.
            if comm.rank == 0:
                raise
            raise SystemExit(exc.status) from None
        # One rank failing alone would leave the others waiting in the next exchange (and in
        # MPI_Finalize): end the whole job with the reason.
        status = exit_status(exc)
        comm.abort(f"es-llm es: error: {exc}" if status is not None else
                   f"es-llm es: rank {comm.rank} failed:\n{traceback.format_exc()}",
                   code=status or 1)


def _es_rank(args, cfg, comm, out: Path) -> None:
    """One rank's part of `es-llm es`: its edges, the run folder, the loop."""
    from es_llm.es.engine import run
    from es_llm.es.setup import build_edges

    if comm.size > 1:
        # If a rank dies, mpirun ends the job and names only the dead process's PID; this
        # line maps that PID to its rank.
        import os
        import socket
        print(f"es-llm: rank {comm.rank}/{comm.size} is pid {os.getpid()} on "
              f"{socket.gethostname()}", file=sys.stderr, flush=True)
    sigmas = _probe_sigmas(args.probe_sigma) if args.probe_sigma else None
    if sigmas and args.resume:
        raise BadInput("--probe-sigma evaluates a new run's first population; drop --resume.")
    edges, problems = build_edges(cfg, comm)
    try:
        if sigmas:
            return _probe(cfg, edges, problems, sigmas, out, comm.rank == 0)
        if comm.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        comm.barrier()
        args.log.attach(out, comm.rank)
        run(cfg, edges, problems, out, progress=not args.no_progress, resume=bool(args.resume))
    finally:
        edges.task.close()


def _probe_sigmas(text: str) -> list[float]:
    try:
        sigmas = [float(x) for x in text.split(",")]
    except ValueError:
        sigmas = []
    if not sigmas or not all(s > 0 and math.isfinite(s) for s in sigmas):
        raise BadInput(f"--probe-sigma {text!r} must be a comma-separated list of positive "
                       f"numbers, e.g. 0.001,0.003,0.01.")
    return sigmas


def _probe(cfg, edges, problems, sigmas, out: Path, lead: bool) -> None:
    from es_llm.es.engine import probe_sigma
    from es_llm.io import write_text_atomic

    rows = probe_sigma(edges, cfg, problems, sigmas)
    if not lead:
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "probe_sigma.json", json.dumps(rows, indent=1) + "\n")
    keys = [k for k in rows[0] if k != "sigma"]
    print("sigma      " + "  ".join(f"{k:>20}" for k in keys))
    for r in rows:
        print(f"{r['sigma']:<10g} " + "  ".join(f"{r[k]:>20.3f}" for k in keys))
    print(f"wrote {out / 'probe_sigma.json'}")


def main(argv: list[str] | None = None) -> int:
    plugins = plugin_commands()
    parser = build_parser(plugins)
    # key=value overrides may stand anywhere, also after options (argparse alone would stop
    # collecting positionals at the first option that follows them).
    args, extra = parser.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = list(args.overrides) + extra
    from es_llm.logs import LibraryLog

    args.log = LibraryLog(verbose=args.verbose or args.print_config).start()
    status, message = 1, None
    try:
        commands = {"testbed": run_testbed, "eval": run_eval, "es": run_es,
                    "compare": run_compare, "testtime": run_testtime}
        commands.update({name: c.run for name, c in plugins.items()})
        commands[args.command](args)
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
