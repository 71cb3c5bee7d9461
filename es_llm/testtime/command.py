"""``es-llm testtime``: test-time methods on one model, priced in generated tokens."""

from __future__ import annotations

from es_llm.command import (BACKEND, MODEL, TASK, Command, Flag, comma_ints, comma_names,
                            writes_out)


COMMAND = Command(
    help="test-time methods on one model, priced in generated tokens",
    description="""\
Run test-time methods on a model and report success against tokens per problem:
independent sampling (solve), direct answers, cpp (facts, then solve), dart (two
direct drafts, solve on disagreement with a calibrated thinking budget), ttel
(localise the error of a failed trajectory, cut and branch), base_select (the
model formalises one candidate, the rest are edited in, every statement
checked), formalize_all (the model formalises every candidate), base_oracle (a
perfect template formaliser: the upper bound), per (plan, execute, review,
repair), broadcast (peers solve, review each other, repair) and discussion
(peers read each other's answers and revise). Every method but independent and
base_oracle needs the multi-role reasoning model (`es-llm testbed
reasoning.enabled=true`, folder reasoning/). On --task knowledge (facts of a
fixed world, composed; its model: `es-llm testbed knowledge.enabled=true`,
folder knowledge/) independent, direct and cpp run. Writes DIR/samples.jsonl,
outcomes.jsonl, metrics.json, report.md and figures/success_vs_tokens.png.""",
    config="es_llm.testtime.run:TestTimeConfig",
    run=writes_out("es_llm.testtime.run:testtime"),
    flags=(MODEL, *TASK,
           Flag("--methods", "methods", metavar="M1,M2,...", convert=comma_names),
           Flag("--budgets", "budgets", metavar="B1,B2,...", convert=comma_ints),
           BACKEND, Flag("--seed", "seed", type=int)),
    out_required=True,
)
