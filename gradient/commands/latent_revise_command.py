"""``es-llm latent-revise``: recover zero-hit prompts by revising failed rollouts' prefixes
in embedding space (``gradient.commands.recovery``)."""

from __future__ import annotations

from es_llm.command import MODEL, TASK, Command, writes_out


COMMAND = Command(
    help="LatentRevise: recover zero-hit prompts by revising failed rollouts' prefixes in "
         "embedding space",
    description="""\
LatentRevise on a model's zero-hit prompts: sample search.n rollouts per training
prompt (default: the model's data/<task>_rl.jsonl); for every prompt none of them solves,
cut a failed rollout into a reasoning prefix and its failed continuation
(revise.cut=first_wrong, the default: through the first step the verifier rejects;
before_first_wrong: the steps before it, the source's cut; fraction: the first
revise.cut_fraction of its steps), optimise the prefix's input embeddings on the
vocabulary simplex with revise.steps Frank-Wolfe steps toward the gold continuation
(revise.anchor=spliced_tail, the default: the reference's remaining steps and answer;
answer: its answer block, the source's anchor) and away from the failed one (lambda =
revise.away_weight; revise.away=log or unlikelihood; model frozen), decode it to tokens,
sample revise.continuations continuations and keep one the task's verifier accepts.
The defaults are the reading the recorded figures are for; continuing from the soft
prefix, as the source does, is not built yet. Plain resampling at the same token passes
runs beside it. Writes DIR/recovered.jsonl (the training data: one verified trajectory
per recovered prompt), resampled.jsonl, base_rollouts.jsonl (as many correct base
samples of other prompts, for an SFT control), attempts.jsonl (with both
log-likelihoods after the soft and after the hard-decoded prefix), metrics.json and
report.md (recovery rates with 95% intervals, their paired difference, token passes and
seconds of both arms).""",
    config="gradient.commands.recovery:LatentReviseConfig",
    run=writes_out("gradient.commands.recovery:latent_revise"),
    flags=(MODEL, *TASK),
    out_required=True,
)
