"""``es-llm eval``: sample a model on a task and score it (``es_llm.evaluate``)."""

from __future__ import annotations

from es_llm.command import BACKEND, MODEL, SAMPLING, STRICT, TASK, Command, writes_out


COMMAND = Command(
    help="sample a model on a task and report pass@k, coverage and diversity",
    description="""\
Sample N completions per problem, score them with the task's verifier and write
DIR/samples.jsonl (one line per sample) and DIR/metrics.json (pass@k for
k = 1, 2, 4, ... up to N with 95% bootstrap CIs over problems, maj@k, pass^k,
coverage, diversity). A testbed model is evaluated on its own held-out set
unless --data is given; other models use the task's generator or --data. A
masked-diffusion model (a folder with diffusion_sampling.json, such as the
testbed's diffusion/) decodes with the sampler saved beside it. A checkpoint of
a training run (RUN/checkpoints/NAME) evaluated on problems the run trained on
gets a warning, or exit status 2 with --strict-overlap.""",
    config="es_llm.evaluate:EvalConfig",
    run=writes_out("es_llm.evaluate:evaluate"),
    flags=(MODEL, *TASK, *SAMPLING, BACKEND, STRICT),
    out_required=True,
)
