"""``es-llm es``: the ES engine on the command line, alone or as one rank of ``mpirun -n P``.

Besides its config it has ``--resume`` (continue a run from its ledger) and
``--probe-sigma`` (measure iteration 0's mirrored pairs at several sigmas instead of a
run). Under MPI a rank that fails alone ends the whole job, and a non-finite update, which
every rank meets at once, ends it with one message from rank 0.
"""

from __future__ import annotations

import json
import math
import sys
import traceback
from pathlib import Path

from es_llm.command import MODEL, Command, training_load, training_out
from es_llm.errors import BadInput, NonFinite, exit_status

# What `es-llm es --resume` may override: the run's length and its checkpoint, checksum and
# timeout cadence, none of which changes the weights it computes.
RESUME_KEYS = ("iterations", "checkpoint_every", "checksum_every", "comm_timeout_s")


def options(p) -> None:
    p.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR: its config.yaml is reloaded, its ledger is "
                        "replayed from the base model to rebuild the weights exactly, and it "
                        "goes on from there; only " + ", ".join(RESUME_KEYS)
                        + " may be overridden (e.g. iterations=N to run longer)")
    p.add_argument("--probe-sigma", metavar="S1,S2,...",
                   help="instead of a run: evaluate iteration 0's mirrored pairs at each of "
                        "these sigmas and report how often + and - differ in reward, in "
                        "correctness and in format, and how often they write the same texts; "
                        "writes DIR/probe_sigma.json")


def run(args, cfg) -> None:
    from es_llm.comm import make_communicator
    from es_llm.es.engine import read_ledger
    from es_llm.run_folder import check_extends, other_machine

    out = training_out(args)
    if args.resume:
        check_extends(out, "iterations", cfg.iterations, len(read_ledger(out)))
    comm = make_communicator(cfg.comm_timeout_s)
    warning = other_machine(out) if args.resume and comm.rank == 0 else None
    if warning:
        print(warning, file=sys.stderr)
    try:
        _rank(args, cfg, comm, out)
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


def _rank(args, cfg, comm, out: Path) -> None:
    """One rank's part of `es-llm es`: its edges, the run folder, the loop."""
    from es_llm.es.engine import OWN_ES
    from es_llm.es.engine import run as run_es
    from es_llm.es.evotorch_loop import EVOTORCH
    from es_llm.es.setup import build_edges

    if comm.size > 1:
        # If a rank dies, mpirun ends the job and names only the dead process's PID; this
        # line maps that PID to its rank.
        import os
        import socket
        print(f"es-llm: rank {comm.rank}/{comm.size} is pid {os.getpid()} on "
              f"{socket.gethostname()}", file=sys.stderr, flush=True)
    sigmas = probe_sigmas(args.probe_sigma) if args.probe_sigma else None
    if sigmas and args.resume:
        raise BadInput("--probe-sigma evaluates a new run's first population; drop --resume.")
    if sigmas and cfg.es.algorithm != "es":
        raise BadInput(f"--probe-sigma measures the mirrored pairs of es-llm's own ES; "
                       f"es.algorithm={cfg.es.algorithm} samples its own population. Drop "
                       f"--probe-sigma or set es.algorithm=es.")
    edges, problems = build_edges(cfg, comm)
    try:
        if sigmas:
            return _probe(cfg, edges, problems, sigmas, out, comm.rank == 0)
        if comm.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        comm.barrier()
        args.log.attach(out, comm.rank)
        run_es(cfg, edges, problems, out, progress=not args.no_progress,
               resume=bool(args.resume),
               search=EVOTORCH if cfg.es.algorithm != "es" else OWN_ES)
    finally:
        edges.task.close()


def probe_sigmas(text: str) -> list[float]:
    """``"0.001,0.01"`` -> ``[0.001, 0.01]``; BadInput unless every part is a positive,
    finite number."""
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


COMMAND = Command(
    help="Evolution Strategies over the model's weights (also under mpirun -n P)",
    description="""\
Evolve the weights of a model with ES: each iteration every member of the
population is the base weights plus sigma times keyed Gaussian noise (or, with
es.kind=lowrank, rank-r noise on every matrix; with lora.enabled, a LoRA
adapter's factors evolve instead and members serve W + (alpha/r) B A), is
scored on the batch of training prompts (or engine.prompts_per_member of them)
with greedy decoding, and the weights move along the shaped-reward-weighted
noise. es.algorithm=pgpe|snes|cem|cmaes hands the search to evotorch instead,
for parameter sets whose population fits in memory (an adapter, a few tensors).
Under `mpirun -n P` the ranks split the population and exchange only rewards;
every rank applies the same update. Writes DIR/config.yaml, metrics.jsonl,
ledger.jsonl and checkpoints/.""",
    config="es_llm.es.config:ESRunConfig",
    run=run,
    flags=(MODEL,),
    options=options,
    load=training_load("an ES", RESUME_KEYS),
)
