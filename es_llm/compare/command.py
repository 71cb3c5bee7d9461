"""``es-llm compare``: models side by side on the same problems (``es_llm.compare``)."""

from __future__ import annotations

from es_llm.command import (BACKEND, SAMPLING, STRICT, TASK, Command, Flag, comma_names,
                            writes_out)


COMMAND = Command(
    help="compare models on the same problems: pass@k, coverage, diversity",
    description="""\
Sample every model with identical settings and seeds on the same problems (or
reuse its samples.jsonl), then write DIR/report.md and DIR/report.html with PNG
figures under DIR/figures/, and DIR/comparison.json with every number in them:
pass@k for k = 1..n with 95% bootstrap bands and crossovers; coverage, overlaps,
per-problem accuracy histograms, progressions and regressions against the
reference model; answer entropy (also on regressions), distinct answers,
distinct-n, self-BLEU and distinct correct solutions; training curves of the runs
the checkpoints came from; gains by difficulty (DRG, accuracy per difficulty bin
of the reference and per tier); with --budget-runs, accuracy along training runs
against generated samples and training seconds; with --geometry, what each model
folder's training did to the reference's weights (update norms, moved share,
effective rank, cosines between updates); with --connectivity, accuracy along
the straight line between two models' weights and its barrier; with --drift,
accuracy and KL to the reference on off-task problem sets (with --budget-runs too,
at every checkpoint along the runs). Several training
seeds of one method are named method@seed and reported as a group (seed spread
beside the bootstrap CIs). A checkpoint of a training run (RUN/checkpoints/NAME)
compared on problems the run trained on gets a warning, or exit status 2 with
--strict-overlap.""",
    config="es_llm.compare.config:CompareConfig",
    run=writes_out("es_llm.compare.run:compare"),
    flags=(Flag("--models", "models", nargs="+", metavar="NAME=PATH"),
           Flag("--reference", "reference", metavar="NAME"),
           *TASK, *SAMPLING, BACKEND, STRICT,
           Flag("--bootstrap", "bootstrap", type=int),
           Flag("--temperatures", "temperatures", type=float, nargs="+", metavar="T"),
           Flag("--also-on", "also_on", nargs="+", metavar="FILE"),
           Flag("--views-n", "views_n", type=int, metavar="N"),
           Flag("--budget-runs", "budget.runs", nargs="+", metavar="METHOD@SEED=RUN_DIR"),
           Flag("--difficulty-file", "difficulty_file", metavar="FILE"),
           Flag("--blind-spot", "blind_spot.enabled", const=True),
           Flag("--testtime-methods", "testtime.methods", metavar="M1,M2,...",
                convert=comma_names),
           Flag("--geometry", "geometry.enabled", const=True),
           Flag("--connectivity", "connectivity.enabled", const=True),
           Flag("--connectivity-pairs", "connectivity.pairs", nargs="+", metavar="A:B"),
           Flag("--connectivity-alphas", "connectivity.alphas", type=float, nargs="+",
                metavar="ALPHA"),
           Flag("--connectivity-n", "connectivity.n", type=int, metavar="N"),
           Flag("--drift", "drift.enabled", const=True),
           Flag("--drift-tasks", "drift.tasks", nargs="+", metavar="[TASK=]FILE"),
           Flag("--drift-kl-prompts", "drift.kl_prompts", type=int, metavar="N")),
    out_required=True,
)
